"""Peak resident memory and load time of one method, measured in a fresh process.

A benchmark process holds every method at once (HF's reference model, the runner's layout
copies, each plugin's own structures), so its memory says nothing about one method. For each
method ``specdec bench --memory`` therefore starts ``python -m selfspec.app._bench.memory`` with
the method, which loads the model as ``specdec`` does (for a plugin: the decoder adopts the
weight layout in place, as the CLI does), decodes a few tokens of one prompt, and prints one
JSON line:

* ``weights_bytes``: the model's parameters and buffers as loaded (before any layout);
* ``load_s``: loading the model (from the converted cache);
* ``setup_s``: what the method builds before its first token (layout, the plugin's setup:
  profiles, compressed layers, exit heads, corpora; for ``hf-assisted`` loading the assistant);
* ``draft_weights_bytes``: the compressed draft weights built for the model
  (:func:`selfspec.draft_weights`, shared by every plugin; 0 when none were built);
* ``peak_rss_bytes``: the process's peak resident set size (``VmHWM``) at the end.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

MEASURE_TOKENS = 16


def method_spec(method: Any, weight_layout: str = "auto") -> dict[str, Any] | None:
    """What the child needs to rebuild ``method`` (a :class:`.harness.Method`) in the runner
    layout ``weight_layout``, or ``None`` for a method it cannot rebuild (a plugin object given
    in memory)."""
    if method.plugin_object is not None:
        return None
    spec = {
        "name": method.name,
        "kind": method.kind,
        "plugin": method.plugin,
        "options": method.options,
        "extra": method.extra,
        "weight_layout": weight_layout,
    }
    if method.assistant is not None:
        spec["assistant"] = method.assistant.name
    return spec


def measure(
    spec: dict[str, Any],
    *,
    model: str | None,
    dtype: str,
    device: str,
    threads: int,
    prompt_ids: list[int],
    tokens: int = MEASURE_TOKENS,
    timeout: float = 1800,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the child for one method; its JSON record, or ``{"error": ...}``. ``placement``:
    ``load()``'s device_map/max_memory/offload_folder, so the child places the model the same."""
    cmd = [
        sys.executable,
        "-m",
        "selfspec.app._bench.memory",
        json.dumps(
            {
                "spec": spec,
                "model": model,
                "dtype": dtype,
                "device": device,
                "threads": threads,
                "prompt_ids": prompt_ids,
                "tokens": tokens,
                "placement": {
                    k: ({str(d): n for d, n in v.items()} if k == "max_memory" and v else v)
                    for k, v in (placement or {}).items()
                },
            }
        ),
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {out.returncode}: {tail}"}
    return json.loads(lines[-1])


def _peak_rss() -> int:
    """This process's peak RSS in bytes: ``VmHWM`` (reset by ``exec``, unlike ``ru_maxrss``,
    which a child inherits from the process that forked it), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux, bytes on macOS


def _child(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from selfspec._engine.contract.loop import Decoder
    from selfspec._engine.drafting.draftweights import built_nbytes
    from selfspec.app._bench.harness import Method, Run, make_runner
    from selfspec.app._models import load

    torch.set_num_threads(int(args["threads"]))
    spec = args["spec"]
    t0 = time.perf_counter()
    loaded = load(
        args["model"], device=args["device"], dtype=args["dtype"], **args.get("placement", {})
    )
    load_s = time.perf_counter() - t0
    weights = sum(
        t.numel() * t.element_size() for t in [*loaded.model.parameters(), *loaded.model.buffers()]
    )
    rss_loaded = _peak_rss()
    eos = set(loaded.eos_token_ids)
    t0 = time.perf_counter()
    if spec["kind"] == "plugin":
        dec = Decoder(
            loaded.model,
            spec["plugin"],
            spec["options"],
            tokenizer=loaded.tokenizer,
            adopt_weights=True,
            weight_layout=spec.get("weight_layout", "auto"),
        )

        def run(ids: list[int], n: int, eos: set[int]) -> Run:
            res = dec.generate(ids, max_new_tokens=n, eos_token_ids=eos)
            return Run(res.output_ids, 0.0, res.stats.forwards)
    else:
        assistant = (
            load(spec["assistant"], device=args["device"], dtype=args["dtype"])
            if spec.get("assistant")
            else None
        )
        method = Method(spec["name"], spec["kind"], extra=spec["extra"], assistant=assistant)
        run = make_runner(method, loaded.model, loaded.tokenizer)
    setup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = run(list(args["prompt_ids"]), int(args["tokens"]), eos)
    decode_s = time.perf_counter() - t0
    return {
        "method": spec["name"],
        "weights_bytes": weights,
        "load_s": load_s,
        "setup_s": setup_s,
        "decode_s": decode_s,
        "new_tokens": len(out.output_ids),
        "rss_after_load_bytes": rss_loaded,
        "draft_weights_bytes": built_nbytes(loaded.model),
        "peak_rss_bytes": _peak_rss(),
        "pid": os.getpid(),
    }


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
