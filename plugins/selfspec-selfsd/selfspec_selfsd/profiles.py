"""Skip-set profiles: which attention/MLP blocks a draft skips, keyed by the model's identity.

A profile is a small JSON file::

    {"format": 1, "identity": {...}, "skip_attn": [..], "skip_mlp": [..], "meta": {...}}

``identity`` names the architecture, the sizes and a fingerprint of the weights, so a profile
tuned for one model is never applied to another by accident. Profiles found by ``tune`` live in
``<selfspec cache dir>/selfsd/profiles/``; the package ships one for the default model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

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
        return {"format": FORMAT, "identity": self.identity, "skip_attn": list(self.skip_attn),
                "skip_mlp": list(self.skip_mlp), "meta": self.meta}


# ---------------------------------------------------------------------------------- identity
def model_identity(runner: Any) -> dict[str, Any]:
    """Architecture, sizes and a weight fingerprint of the runner's model.

    The fingerprint hashes a strided sample of the embedding and of the last layer's
    parameters, cast to bfloat16 first, so float32 and bfloat16 loads of one checkpoint
    agree while different checkpoints of one architecture do not.
    """
    cfg = runner.config
    h = hashlib.sha256()
    tensors = [runner.adapter.base.embed_tokens.weight, *runner.layers[-1].parameters()]
    for t in tensors:
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel() // 2048)
        sample = flat[::step][:2048].to("cpu", torch.bfloat16).to(torch.float32)
        h.update(str(tuple(t.shape)).encode())
        h.update(sample.numpy().tobytes())
    return {
        "model_type": str(getattr(cfg, "model_type", type(runner.model).__name__)),
        "n_layers": int(runner.n_layers),
        "hidden_size": int(runner.hidden_size),
        "vocab_size": int(runner.vocab_size),
        "fingerprint": h.hexdigest()[:16],
    }


def identity_key(identity: dict[str, Any]) -> str:
    """File-name key of an identity, e.g. ``llama-30x576-1a2b3c4d5e6f7a8b``."""
    return f"{identity['model_type']}-{identity['n_layers']}x{identity['hidden_size']}-{identity['fingerprint']}"


def user_profile_dir() -> Path:
    from selfspec.models import cache_dir

    return Path(cache_dir()) / "selfsd" / "profiles"


# ---------------------------------------------------------------------------------- files
def save(profile: Profile, path: str | Path | None = None) -> Path:
    """Write ``profile`` (default: the user profile directory, named by its identity)."""
    target = Path(path) if path is not None else user_profile_dir() / f"{identity_key(profile.identity)}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(profile.as_json(), indent=1) + "\n")
    tmp.replace(target)
    return target


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
        prof = Profile(dict(data["identity"]), tuple(int(i) for i in data["skip_attn"]),
                       tuple(int(i) for i in data["skip_mlp"]), dict(data.get("meta") or {}), str(p))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"profile {p} is malformed: {exc}") from None
    if identity is not None and prof.identity != identity:
        diff = sorted(k for k in set(identity) | set(prof.identity) if identity.get(k) != prof.identity.get(k))
        raise ProfileError(f"profile {p} was made for another model (differs in {', '.join(diff)})")
    n = prof.identity.get("n_layers")
    if any(not 0 <= i < int(n) for i in (*prof.skip_attn, *prof.skip_mlp)):
        raise ProfileError(f"profile {p} names a layer outside [0, {n})")
    return prof


def find(identity: dict[str, Any]) -> Profile | None:
    """The profile for ``identity``: the user's own (from ``tune``) first, then a shipped one."""
    name = f"{identity_key(identity)}.json"
    user = user_profile_dir() / name
    if user.is_file():
        return load(user, identity)
    shipped = resources.files(__package__).joinpath("profiles", name)
    if shipped.is_file():
        with resources.as_file(shipped) as path:
            return load(path, identity)
    return None


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


def parse_layers(text: str | None, n_layers: int, name: str = "layers") -> tuple[int, ...] | None:
    """``"3,5,10-12"`` -> ``(3, 5, 10, 11, 12)``; ``""`` or ``"none"`` -> ``()``; None -> None."""
    if text is None:
        return None
    s = text.strip().lower()
    if s in ("", "none", "-"):
        return ()
    out: set[int] = set()
    for part in s.replace(" ", "").split(","):
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ValueError(f"{name}: {part!r} is not a layer index or range (e.g. 3,5,10-12)") from None
    bad = [i for i in out if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"{name}: layer {bad[0]} is outside [0, {n_layers})")
    return tuple(sorted(out))


def format_layers(layers: tuple[int, ...] | list[int]) -> str:
    """Inverse of :func:`parse_layers`, with ranges: ``(3, 10, 11, 12)`` -> ``"3,10-12"``."""
    xs = sorted(set(layers))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts) if parts else "none"
