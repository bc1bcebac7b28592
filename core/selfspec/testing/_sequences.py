"""The fixed decode sequences of :class:`~selfspec.testing.PluginSuite`'s tests that are not
Hypothesis properties: one ``Decoder`` decodes them in turn, so state a plugin keeps across
decodes is exercised."""

from __future__ import annotations

#: The seeds of the sampled decodes ``test_lossless_across_decodes`` ends with.
SAMPLED_SEEDS: tuple[int, ...] = (11, 12)
#: ``(prompt, max_new_tokens)`` decoded in turn by one Decoder in ``test_lossless_across_decodes``,
#: after a warm-up on the first prompt (16 tokens, as ``specdec bench`` warms up): a repetitive
#: prompt, the same prompt again with a longer budget, another motif, a plain ramp.
DECODE_SEQUENCE: tuple[tuple[tuple[int, ...], int], ...] = (
    ((3, 4, 5) * 8, 24),
    ((3, 4, 5) * 8, 40),
    ((1, 2) * 20, 24),
    (tuple(range(7, 19)), 16),
)

#: The prompt and budget of ``test_verify_any_draft``'s decodes (a repetitive prompt).
ANY_DRAFT_PROMPT: tuple[int, ...] = (9, 4, 17, 4, 2) * 8
ANY_DRAFT_NEW = 32
#: The index in that decode's reference output of the EOS id of its fixed EOS example (the
#: kit drafts another EOS id there).
ANY_DRAFT_EOS_AT = 20
#: ``(prompt, max_new_tokens)`` decoded in turn by one Decoder in ``test_lossless_offloaded``
#: (a few fixed examples: every forward of an offloaded model reads the disk).
OFFLOAD_SEQUENCE: tuple[tuple[tuple[int, ...], int], ...] = (
    ((3, 4, 5) * 8, 24),
    ((1, 2) * 20, 24),
    (tuple(range(7, 19)), 16),
)
