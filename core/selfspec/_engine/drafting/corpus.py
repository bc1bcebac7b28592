"""The corpus a draft vocabulary is ranked by: a registry the app fills (a leaf module, cheap).

The engine never imports the app's data module; ``specdec`` registers the app's dev-split texts
here at start-up, and a script registers its own with
:func:`selfspec.provisional.set_vocab_corpus`.
"""

from __future__ import annotations

from typing import Any

#: The registered corpus: a callable ``tasks -> iterable of texts`` (``None``: no corpus).
_CORPUS: list[Any] = [None]


def set_vocab_corpus(source: Any) -> None:
    """Register the corpus a draft vocabulary is ranked by: a callable ``tasks -> iterable of
    texts`` (``tasks`` a tuple of task names the caller may ignore), or ``None`` to register
    none. ``specdec`` registers ``selfspec.app.corpus_texts``; a script that asks for a draft
    vocabulary registers its own (or the app's) before building a decoder."""
    if source is not None and not callable(source):
        raise TypeError("set_vocab_corpus takes a callable tasks -> iterable of texts, or None")
    _CORPUS[0] = source


def corpus_source() -> Any:
    """The registered corpus callable, or ``None`` when none is registered."""
    return _CORPUS[0]
