"""The engine's implementation (private): the decode loop, the runner, verification,
drafting mechanics, sampling, artefacts. Its public names are re-exported by ``selfspec``
(the stable contract) and ``selfspec.provisional``; nothing here is imported by name from
outside the package."""
