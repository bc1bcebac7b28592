"""Skip-set profiles: which attention/MLP blocks a draft skips, keyed by the model's identity.

A profile is a small JSON file::

    {"format": 1, "identity": {...}, "skip_attn": [..], "skip_mlp": [..], "meta": {...}}

``identity`` is the host's :class:`selfspec.ModelIdentity` (architecture, sizes and a fingerprint
of the weights), so a profile tuned for one model is never applied to another by accident.
Profiles found by ``tune`` live in the plugin's artefact store
(``<selfspec cache dir>/selfsd/profiles/``); the package ships one for the default model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selfspec import ArtefactStore, ModelIdentity, resolve_profile

FORMAT = 1


class ProfileError(ValueError):
    """A profile file is unreadable, malformed, or belongs to another model."""


@dataclass(frozen=True)
class Profile:
    """A skip set: layer indices whose attention / MLP block the draft skips."""

    identity: dict[str, Any]
    skip_attn: tuple[int, ...]
    skip_mlp: tuple[int, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    source: str = field(default="", compare=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "identity": self.identity,
            "skip_attn": list(self.skip_attn),
            "skip_mlp": list(self.skip_mlp),
            "meta": self.meta,
        }


STORE = ArtefactStore("selfsd", shipped=__package__)


def file_name(identity: ModelIdentity) -> str:
    """Where the profile of ``identity`` lives, in the store and among the shipped ones."""
    return f"profiles/{identity.key}.json"


# ---------------------------------------------------------------------------------- files
def save(profile: Profile, path: str | Path | None = None) -> Path:
    """Write ``profile`` atomically (default: the store, named by its identity, which
    ``profile=auto`` finds)."""
    target = (
        Path(path) if path is not None else STORE.path(file_name(ModelIdentity(**profile.identity)))
    )
    return STORE.save_text(target, json.dumps(profile.as_json(), indent=1) + "\n")


def load(path: str | Path, identity: dict[str, Any] | None = None) -> Profile:
    """Read a profile; with ``identity``, refuse one made for another model."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {p}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {p} is not valid JSON: {exc}") from None
    try:
        if data.get("format") != FORMAT:
            raise ProfileError(f"profile {p} has format {data.get('format')!r}, expected {FORMAT}")
        prof = Profile(
            dict(data["identity"]),
            tuple(int(i) for i in data["skip_attn"]),
            tuple(int(i) for i in data["skip_mlp"]),
            dict(data.get("meta") or {}),
            str(p),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"profile {p} is malformed: {exc}") from None
    if identity is not None and prof.identity != identity:
        diff = sorted(
            k for k in set(identity) | set(prof.identity) if identity.get(k) != prof.identity.get(k)
        )
        raise ProfileError(f"profile {p} was made for another model (differs in {', '.join(diff)})")
    n = prof.identity.get("n_layers")
    if any(not 0 <= i < int(n) for i in (*prof.skip_attn, *prof.skip_mlp)):
        raise ProfileError(f"profile {p} names a layer outside [0, {n})")
    return prof


def find(identity: ModelIdentity) -> Profile | None:
    """The profile for ``identity``: the user's own (from ``tune``) first, then a shipped one."""
    path = resolve_profile("auto", STORE, file_name(identity))
    return None if path is None else load(path, identity.as_dict())


# ---------------------------------------------------------------------------------- heuristic
def heuristic(n_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The fallback skip set when no profile exists: ``(skip_attn, skip_mlp)``.

    Skip the attention block of every other layer in the later half (from the middle layer
    on, the last layer always runs) and no MLP block. The paper's searched sets (Fig. 6) skip
    attention more than MLP and mostly in later layers; small models tolerate few skips (on
    SmolLM2-135M skipping the whole later half's attention leaves almost no draft accepted),
    hence every other one.
    """
    if n_layers < 4:
        return (), ()
    return tuple(range(n_layers // 2, n_layers - 1, 2)), ()
