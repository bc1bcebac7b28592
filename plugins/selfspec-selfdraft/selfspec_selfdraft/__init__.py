"""Multi-Branch Self-Drafting (Gao et al., AAAI 2025) as a selfspec plugin.

Draft branches decoded in the same forward as verification feed a context n-gram cache; a
corpus n-gram cache adds general expressions; candidates from both are verified in that same
forward, and exactly the accepted path stays in the KV cache. See the README.
"""

from .plugin import SelfDraft

__all__ = ["SelfDraft"]
