"""HiSpec (hierarchical speculative decoding) as a selfspec plugin.

Draft with the early exit at layer L_d, check the drafts with the exit at L_i (tentatively
accepted tokens stay in a private buffer), and verify the buffer with the full model, reusing
every layer already computed: nothing runs twice for an accepted token. See ``plugin.py``.
"""

from .plugin import HiSpec

__all__ = ["HiSpec"]
