"""Known-lossy plugins: the kit's own mutation score.

:class:`Echo` is a small correct drafter (it copies what followed the last earlier occurrence
of the pending token, up to ``k`` tokens) with its own verify and cache hooks that defer to the
built-in mechanics. Each mutant changes one thing, the way plugin authors get it wrong, and
only past a threshold (long prompts, late in a long output, deep drafts), so that a kit whose
strategies stay short cannot see it. ``MUTANTS`` lists them with a one-line description;
``tests/test_mutants.py`` checks that a standard :class:`~selfspec.testing.PluginSuite` under
the ``selfspec-ci`` profile catches every one and that :class:`Echo` passes.
"""

from __future__ import annotations

from selfspec.testing._mutants._classic import (
    DropsSlotEvery130,
    EditsHeadInSetup,
    PastMismatchLongPrompt,
    PastMismatchPrompt400,
    PastMismatchVeryLongPrompt,
    PendingOverwrittenLate,
    PolicyCorruptsKVLate,
    ProposerOverwritesLong,
    ShiftedSlotsDeep,
    SkipsCheckDeep,
    SkipsCheckLate,
    SkipsCheckLongPrompt,
    StaleKVLate,
    StepKeyedNoise,
    WrongBonusLate,
    WrongBonusVeryLate,
    WrongTokenAfter200,
    WrongTokenGemmaLate,
)
from selfspec.testing._mutants._echo import Echo, _accept_all
from selfspec.testing._mutants._hidden import (
    AcceptsNearTies,
    AcceptsOtherEos,
    ClampsPositions,
    EosAlias,
    ForgetsTopK,
    SeedlessPicks,
    SiblingMaskRowDeep,
)

#: Every mutant, in the order of the score table.
MUTANTS: tuple[type[Echo], ...] = (
    WrongBonusLate,
    WrongBonusVeryLate,
    PastMismatchLongPrompt,
    PastMismatchVeryLongPrompt,
    ShiftedSlotsDeep,
    ProposerOverwritesLong,
    PendingOverwrittenLate,
    StaleKVLate,
    SkipsCheckLongPrompt,
    SkipsCheckDeep,
    SkipsCheckLate,
    StepKeyedNoise,
    PastMismatchPrompt400,
    WrongTokenAfter200,
    WrongTokenGemmaLate,
    DropsSlotEvery130,
    EditsHeadInSetup,
    PolicyCorruptsKVLate,
    ForgetsTopK,
    EosAlias,
    SeedlessPicks,
    AcceptsNearTies,
    SiblingMaskRowDeep,
    ClampsPositions,
    AcceptsOtherEos,
)

__all__ = [
    "Echo",
    "MUTANTS",
    "_accept_all",
    "WrongBonusLate",
    "WrongBonusVeryLate",
    "PastMismatchLongPrompt",
    "PastMismatchVeryLongPrompt",
    "ShiftedSlotsDeep",
    "ProposerOverwritesLong",
    "PendingOverwrittenLate",
    "StaleKVLate",
    "SkipsCheckLongPrompt",
    "SkipsCheckDeep",
    "SkipsCheckLate",
    "StepKeyedNoise",
    "PastMismatchPrompt400",
    "WrongTokenAfter200",
    "WrongTokenGemmaLate",
    "DropsSlotEvery130",
    "EditsHeadInSetup",
    "PolicyCorruptsKVLate",
    "ForgetsTopK",
    "EosAlias",
    "SeedlessPicks",
    "AcceptsNearTies",
    "SiblingMaskRowDeep",
    "ClampsPositions",
    "AcceptsOtherEos",
]
