"""The tuning room (bottom): measured choices (candidates it is handed, timed and cached),
the machine's facts, the cache directory and per-plugin artefact stores, the progress line,
the version string.
It imports no other room."""
