"""The contract room: the decode loop, the hooks and the values that cross them (types,
options), plugin loading and composition, verification, sampling, the greedy reference and
the audit. It imports the runner and tuning below it, never the drafting room above."""
