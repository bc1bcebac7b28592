"""The tuning room (bottom): measured choices (candidates it is handed, timed and cached),
the machine's facts, the cache directory and per-plugin artefact stores, the progress line.
It imports no other room."""
