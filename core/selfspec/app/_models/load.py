"""``load()``: resolve what the user named (an alias, a directory, a GGUF file, a hub id) and
load the model and tokenizer; ``format_prompt`` and ``eos_token_ids`` for what comes after."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from selfspec._engine.contract.eos import eos_token_ids
from selfspec.app._models.common import (
    DEFAULT_MODEL,
    Loaded,
    ModelLoadError,
    _check_runner,
    _first_line,
    parse_device,
    parse_dtype,
)
from selfspec.app._models.convert import _converted
from selfspec.app._models.embedded import ALIASES, EMBEDDED, _embedded_gguf
from selfspec.app._models.placement import placement_request


def load(
    model: str | os.PathLike[str] | None = None,
    *,
    device: str = "cpu",
    dtype: str | torch.dtype = "float32",
    device_map: str | dict[str, Any] | None = None,
    chat: bool | None = None,
    max_memory: str | dict[Any, Any] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
) -> Loaded:
    """Load a causal LM and its tokenizer: a ``Loaded`` (``.model``, ``.tokenizer``, ``.chat``,
    ``.eos_token_ids``, ``.placement``). The host's one loader: the CLI, ``specdec bench`` and
    ``specdec sweep`` use it.

    ``model``: None (the embedded default), an embedded alias (``smollm2-135m-instruct``,
    ``gemma3-270m``, ``qwen2.5-coder-1.5b``, ``qwen2.5-coder-0.5b``; see ``specdec models``), a
    Hugging Face model directory, a ``.gguf`` file, or a hub id already in the local hub cache.
    ``device``: ``cpu``, ``cuda`` or ``cuda:N`` (ignored when a placement is asked for).
    ``dtype``: ``float32``, ``bf16``/``bfloat16``, ``fp16``/``float16`` or ``float64``. ``chat``:
    apply the chat template to prompts (default: for instruct models that have one).

    A model bigger than memory (accelerate places it, :mod:`.placement`): ``device_map``
    (``"auto"``, ``"balanced"``, ``"balanced_low_0"``, ``"sequential"``, a ``{module: device}``
    dict or its JSON text; devices ``cpu``, ``disk``, ``cuda:N`` or an index), ``max_memory``
    (``"cpu=6GiB,disk=40GiB"`` or ``{"cpu": "6GiB"}``: what each device may hold; the rest
    goes to the next device, then to disk) and ``offload_folder`` (where weights offloaded to
    disk are written when the checkpoint is not safetensors). Either of the last two alone
    means ``device_map="auto"``. A bad value is a :class:`ModelLoadError` of one line; so is a
    model that cannot be loaded, with a message saying what to do.

    The result's ``placement`` (and ``Runner.placement``, ``Stats.placement``) says where the
    layers went; ``None`` for a model on one device. Every plugin decodes such a model
    losslessly, its drafts reading the host's in-memory draft weights, never the disk::

        from selfspec import Decoder
        from selfspec.app import format_prompt, load_model

        loaded = load_model("qwen2.5-coder-1.5b", max_memory="cpu=4.4GiB")  # the rest on disk
        print(loaded.placement["layers"])  # "0-14 cpu, 15-27 disk"
        decoder = Decoder(loaded.model, "selfsd", tokenizer=loaded.tokenizer)
        result = decoder.generate(format_prompt(loaded, "Reverse a string in Python."), 64)
        print(result.text, result.stats.tau, result.stats.placement["offloaded_layers"])

    A model dispatched by other means (``accelerate.dispatch_model``, ``from_pretrained`` in
    your own code) works the same way: ``Decoder`` reads the placement off the model's hooks.
    """
    torch_dtype = parse_dtype(dtype)
    request = placement_request(device_map, max_memory, offload_folder)
    dev = parse_device(device) if not request.asked else None
    spec = str(model) if model is not None else DEFAULT_MODEL
    spec = ALIASES.get(spec, spec)

    if spec in EMBEDDED:
        emb = EMBEDDED[spec]
        gguf = _embedded_gguf(spec, emb)
        directory, source, default_chat = _converted(gguf, torch_dtype), str(gguf), emb.chat
    else:
        path = Path(spec).expanduser()
        if path.suffix.lower() == ".gguf":
            if not path.is_file():
                raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
            directory, source, default_chat = (
                _converted(path.resolve(), torch_dtype),
                str(path),
                None,
            )
        elif path.is_dir():
            directory, source, default_chat = _model_dir(path, torch_dtype), str(path), None
        elif path.exists():
            raise ModelLoadError(
                f"{spec!r} is a file but not a .gguf file; give a model directory or a .gguf file"
            )
        elif _looks_like_hub_id(spec):
            directory, source, default_chat = spec, spec, None
        else:
            raise ModelLoadError(
                f"model {spec!r} not found: give a model directory, a .gguf file, a hub id in the "
                f"local Hugging Face cache, or one of: {', '.join(EMBEDDED)}"
            )

    _check_architecture(directory, spec)
    model_obj, tokenizer = _from_pretrained(directory, spec, torch_dtype, request.kwargs())
    if isinstance(request.device_map, dict):  # a name matching no module is a typo, never ignored
        names = {name for name, _ in model_obj.named_modules()}
        unknown = [k for k in request.device_map if k and k not in names]
        if unknown:
            top = [name for name in names if name.count(".") <= 1 and name] + ["model.layers.N"]
            raise ModelLoadError(
                f"--device-map names modules model {spec!r} does not have: {', '.join(unknown)} "
                f"(its modules include {', '.join(sorted(set(top)))})"
            )
    if dev is not None:
        model_obj.to(dev)
    model_obj.eval()
    _check_runner(model_obj, spec)

    has_template = getattr(tokenizer, "chat_template", None) is not None
    use_chat = has_template and (
        chat if chat is not None else default_chat if default_chat is not None else True
    )
    if chat and not has_template:
        raise ModelLoadError(f"model {spec!r} has no chat template; run without chat")
    name = spec if spec in EMBEDDED else str(model)
    loaded = Loaded(model_obj, tokenizer, name, source, bool(use_chat))
    loaded.eos_token_ids = eos_token_ids(model_obj, tokenizer)
    loaded.request = request
    return loaded


def format_prompt(loaded: Loaded, text: str) -> list[int]:
    """Token ids of one user turn ``text``: through the chat template for chat models, else a
    plain encode with the tokenizer's special tokens. The host's one prompt encoder:
    ``specdec``, ``specdec check`` and ``specdec bench`` all use it."""
    return format_conversation(loaded, [text], [])


def format_conversation(loaded: Loaded, user_turns: list[str], answers: list[str]) -> list[int]:
    """Token ids of a conversation whose next turn is the model's: ``user_turns[i]`` then, for
    every earlier turn, ``answers[i]`` (one fewer answer than user turns).

    Chat models: the chat template over the alternating user/assistant messages with the
    generation prompt. Other models: the turns and answers joined by blank lines, plainly encoded.
    """
    if len(answers) != len(user_turns) - 1:
        raise ValueError(
            f"{len(user_turns)} user turn(s) need {len(user_turns) - 1} answer(s), "
            f"not {len(answers)}"
        )
    if any(not t or not t.strip() for t in user_turns):
        raise ValueError("the prompt is empty")
    tok = loaded.tokenizer
    if loaded.chat:
        messages = []
        for i, turn in enumerate(user_turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        ids = tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ids = list(ids)
        if ids and isinstance(ids[0], list):  # a batch of one
            ids = ids[0]
    else:
        parts = [x for pair in zip(user_turns, [*answers, ""]) for x in pair if x]
        ids = tok.encode("\n\n".join(parts))
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def _model_dir(path: Path, dtype: torch.dtype = torch.float32) -> Path | str:
    if (path / "config.json").is_file():
        return path
    if (path / "snapshots").is_dir():  # a hub cache entry: models--org--name/
        return _model_dir(_snapshot(path), dtype)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _converted(ggufs[0].resolve(), dtype)
    if ggufs:
        raise ModelLoadError(f"{str(path)!r} holds several .gguf files; give the one to load")
    raise ModelLoadError(
        f"{str(path)!r} is not a model directory (no config.json or .gguf file in it)"
    )


def _snapshot(repo: Path) -> Path:
    """The snapshot a hub cache entry's ``refs/main`` names (else the newest one)."""
    ref = repo / "refs" / "main"
    if ref.is_file() and (repo / "snapshots" / ref.read_text().strip()).is_dir():
        return repo / "snapshots" / ref.read_text().strip()
    snaps = sorted(
        (p for p in (repo / "snapshots").iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime
    )
    if not snaps:
        raise ModelLoadError(f"{str(repo)!r} is a hub cache entry with no snapshot in it")
    return snaps[-1]


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _check_architecture(directory: Path | str, spec: str) -> None:
    """Refuse an architecture the runner cannot drive before loading any weights."""
    from transformers import AutoConfig

    from selfspec._engine.runner import supported_model_types

    try:
        config = AutoConfig.from_pretrained(str(directory))
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read the configuration of {spec!r}: {_first_line(exc)}"
        ) from exc
    model_type = getattr(config, "model_type", None)
    text = getattr(config, "get_text_config", lambda: config)()
    types = {model_type, getattr(text, "model_type", None)}
    if not types & set(supported_model_types()):
        raise ModelLoadError(
            f"model {spec!r} has architecture {model_type!r}, which the selfspec runner does not "
            f"support; supported: {', '.join(supported_model_types())}"
        )


def _from_pretrained(
    directory: Path | str, spec: str, dtype: torch.dtype, placement: dict[str, Any]
) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    kwargs: dict[str, Any] = {"dtype": dtype, **placement}
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-second load needs no progress bar
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except Exception as exc:
        raise ModelLoadError(f"could not load model {spec!r}: {_first_line(exc)}") from exc
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception as exc:
        raise ModelLoadError(
            f"could not load the tokenizer of {spec!r}: {_first_line(exc)}"
        ) from exc
    return model, tokenizer
