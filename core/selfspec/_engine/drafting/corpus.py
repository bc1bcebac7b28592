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
    none. ``specdec`` registers ``selfspec.app.corpus_texts`` (the app's dev-split texts); a
    script that builds a decoder with ``draft_vocab > 0`` registers its own (or the app's)
    first, else the draft vocabulary falls back to the whole vocabulary with one line on stderr
    saying so. The engine never imports the app, so this is how the app's data reaches it."""
    if source is not None and not callable(source):
        raise TypeError("set_vocab_corpus takes a callable tasks -> iterable of texts, or None")
    _CORPUS[0] = source


def corpus_source() -> Any:
    """The registered corpus callable, or ``None`` when none is registered."""
    return _CORPUS[0]
