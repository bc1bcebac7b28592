"""The machine's limit: streaming read bandwidth, bytes of weights per committed token, and
how close each method runs to ``bandwidth / bytes per token``.

On a CPU a one-token forward is bound by streaming the weights from memory, so the fastest
any decode of a model can run is the machine's read bandwidth over the bytes of weights it
reads per committed token: the whole model's products once per token for HF ``generate`` and
``vanilla``; for a speculative method, the whole model once per verification plus the draft
weights it reads per draft pass, divided by the tokens committed (``Stats.weight_bytes`` of
every decode). The limit bounds the decode, not the prompt's prefill (compute-bound: every
prompt token through every product), so the rate held against it is the *decode* rate: new
tokens after the prefill over the wall time after it (``Run.prefill_s``, ``prefill_new_tokens``).
``% of limit`` = decode tokens/s over the limit; ``limit vs vanilla`` = vanilla's bytes per
token over the method's, the speedup the method's measured τ and draft cost would give if both
ran at the limit; ``decode vs vanilla`` = the decode rate over vanilla's. The wall-clock
speedups of the bench's main tables include the prefill, which bounds them: :func:`prefill_share`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

#: Bytes of the buffer the bandwidth is read from (far beyond any CPU's caches).
BUFFER_BYTES = 1 << 30


#: Columns of the matrix view the matrix-vector read uses (a product's input width).
_MV_COLUMNS = 4096


def read_bandwidth(
    nbytes: int = BUFFER_BYTES, repeats: int = 5, device: torch.device | str = "cpu"
) -> float:
    """The streaming read bandwidth of ``device``'s memory in bytes/s: the fastest of
    :func:`read_bandwidths`' kernels. A limit that a product kernel beats is no limit, and
    which read is fastest depends on the machine (on an Intel Xeon host the BLAS matrix-vector
    product read up to half again as fast as a sum with two threads; on a Zen 4 the sum is
    the faster)."""
    return max(read_bandwidths(nbytes, repeats, device).values())


def read_bandwidths(
    nbytes: int = BUFFER_BYTES, repeats: int = 5, device: torch.device | str = "cpu"
) -> dict[str, float]:
    """Bytes/s of each way of streaming a float32 buffer of ``nbytes`` on ``device``, the
    fastest of ``repeats`` calls each: ``sum`` (one addition per 4 bytes read) and ``mv`` (the
    buffer as a ``[n, 4096]`` matrix times a vector: the library's matrix-vector kernel, the
    one a one-token product runs). Both are bound by memory, not arithmetic. On the CPU they
    run with the process's torch threads; on an accelerator the device is synchronised around
    each timed call, so the figure is the model's own memory (a GPU's, not the host's)."""
    device = torch.device(device)
    sync = _synchronize(device)
    cols = _MV_COLUMNS if nbytes >= 4 * _MV_COLUMNS else 1
    buf = torch.ones(nbytes // 4 // cols, cols, dtype=torch.float32, device=device)
    ones = torch.ones(cols, dtype=torch.float32, device=device)
    kernels = {"sum": buf.sum, "mv": lambda: torch.mv(buf, ones)}
    out = {}
    for name, fn in kernels.items():
        fn()  # warm-up: pages touched, threads or kernels started
        sync()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            sync()
            best = min(best, time.perf_counter() - t0)
        out[name] = buf.numel() * 4 / best
    return out


def model_bytes(model: torch.nn.Module) -> int:
    """Bytes of product weights one full forward of ``model`` reads: every decoder layer's
    linears and the LM head (in the model's own dtype)."""
    from selfspec._engine.runner.adapters import adapter_for
    from selfspec._engine.runner.traffic import product_bytes

    adapter = adapter_for(model)
    return sum(product_bytes(layer) for layer in adapter.layers) + product_bytes(adapter.lm_head)


def roofline(
    records: Sequence[dict[str, Any]],
    *,
    bandwidth: float,
    full_forward_bytes: int,
    baseline: str = "vanilla",
    device: str = "cpu",
) -> dict[str, Any]:
    """``{"bandwidth_bytes_per_s", "model_bytes", "device", "prefill_share", "rows": [...]}``
    (:func:`prefill_share` of ``baseline``), a row per method over every
    record: ``bytes_per_token`` (records' ``weight_bytes``; HF's methods read the whole model
    once per forward), ``limit_tokens_per_s``, ``tokens_per_s`` (wall clock, prefill included),
    ``decode_tokens_per_s`` (after the prefill; ``None`` when a record's prefill is unknown),
    ``of_limit`` (the decode rate over the limit, else ``None``), ``limit_vs_vanilla`` and
    ``decode_vs_vanilla``."""
    rows = []
    for m in dict.fromkeys(r["method"] for r in records):
        rs = [r for r in records if r["method"] == m]
        tokens = sum(r["new_tokens"] for r in rs)
        wall = sum(r["wall_time"] for r in rs)
        if any(r.get("weight_bytes") is None for r in rs):
            if any(r.get("plugin") for r in rs):
                continue  # a plugin's records from before weight bytes were counted
            read = sum((r.get("forwards") or r["new_tokens"]) * full_forward_bytes for r in rs)
        else:
            read = sum(r["weight_bytes"] for r in rs)
        if not tokens or not read:
            continue
        per_token = read / tokens
        limit = bandwidth / per_token
        decode = _decode_rate(rs)
        rows.append(
            {
                "method": m,
                "bytes_per_token": per_token,
                "limit_tokens_per_s": limit,
                "tokens_per_s": tokens / wall if wall > 0 else 0.0,
                "decode_tokens_per_s": decode,
                "of_limit": decode / limit if decode is not None else None,
            }
        )
    base = next((r for r in rows if r["method"] == baseline), None)
    for r in rows:
        r["limit_vs_vanilla"] = base["bytes_per_token"] / r["bytes_per_token"] if base else None
        both = (
            base is not None
            and base["decode_tokens_per_s"]
            and r["decode_tokens_per_s"] is not None
        )
        r["decode_vs_vanilla"] = (
            r["decode_tokens_per_s"] / base["decode_tokens_per_s"] if both else None
        )
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "model_bytes": full_forward_bytes,
        "device": device,
        "rows": rows,
        "prefill_share": prefill_share(records, baseline),
    }


def prefill_share(records: Sequence[dict[str, Any]], baseline: str = "vanilla") -> float | None:
    """The fraction of ``baseline``'s wall time its prefills took (``None`` without them). Every
    method of the host prefills the same prompt the same way, so a method that decoded in no time
    at all would be at most ``1 / share`` times ``baseline``'s wall-clock speed."""
    rs = [r for r in records if r["method"] == baseline]
    wall = sum(r["wall_time"] for r in rs)
    if not rs or wall <= 0 or any(r.get("prefill_s") is None for r in rs):
        return None
    return sum(r["prefill_s"] for r in rs) / wall


def _decode_rate(records: Sequence[dict[str, Any]]) -> float | None:
    """New tokens after the prefill per second of wall time after it, over ``records`` (``None``
    when any record's prefill time is unknown)."""
    if any(r.get("prefill_s") is None for r in records):
        return None
    tokens = sum(r["new_tokens"] - (r.get("prefill_new_tokens") or 0) for r in records)
    seconds = sum(r["wall_time"] - r["prefill_s"] for r in records)
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def markdown(summary: dict[str, Any]) -> list[str]:
    """The "Against the machine's limit" table (no lines without a roofline in ``summary``)."""
    roof = summary.get("roofline")
    if not roof:
        return []
    bw = roof["bandwidth_bytes_per_s"] / 1e9
    lines = [
        "",
        f"**Against the machine's limit** (streaming read {bw:.1f} GB/s of the "
        f"{roof.get('device', 'cpu')}'s memory, the higher of "
        "the measurements before and after the run; "
        f"one full forward reads {roof['model_bytes'] / 1e9:.2f} GB of weights; "
        "limit = bandwidth / bytes "
        "of weights read per committed token; the decode's rate, after each prompt's prefill, "
        "is held against it; "
        "–: prefill not separable)",
        "",
        "| method | GB per token | limit tok/s | decode tok/s | % of limit | limit vs vanilla "
        "| decode vs vanilla |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in roof["rows"]:
        decode = r.get("decode_tokens_per_s")
        lines.append(
            f"| {r['method']} | {r['bytes_per_token'] / 1e9:.3f} | {r['limit_tokens_per_s']:.1f} | "
            f"{_fmt(decode, '{:.1f}')} | {_fmt(r['of_limit'], '{:.0%}')} | "
            f"{_fmt(r['limit_vs_vanilla'], '{:.2f}×')} | "
            f"{_fmt(r.get('decode_vs_vanilla'), '{:.2f}×')} |"
        )
    share = roof.get("prefill_share")
    if share:
        lines += [
            "",
            f"Prefill took {share:.0%} of `vanilla`'s wall time here. It is compute-bound and the "
            "same for every method of the host, so no method of the host can exceed "
            f"{1 / share:.1f}× `vanilla`'s tokens/s over this run, however fast it decodes.",
        ]
    return lines


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else spec.format(x)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device the model's weights live on (its first parameter's; the CPU for a model with
    none): the memory whose bandwidth bounds its decode."""
    return next(
        (p.device for p in model.parameters() if p.device.type != "meta"), torch.device("cpu")
    )


def _synchronize(device: torch.device):
    """A callable that waits for ``device``'s queued work (a no-op on the CPU)."""
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    wait = getattr(backend, "synchronize", None)
    return (lambda: wait(device)) if wait is not None else (lambda: None)


def add_limits(
    summary: dict[str, Any],
    records: Sequence[dict[str, Any]],
    model: torch.nn.Module,
    earlier: Sequence[float] = (),
) -> None:
    """Into a bench ``summary``: the roofline (:func:`roofline`) and how every ``auto`` of the
    run was decided. The bandwidth is measured now, with the run's threads, and taken as the
    highest of that and the ``earlier`` measurements of the run (bytes/s): on a shared machine
    other processes' memory traffic lowers any one measurement, and the limit is the most the
    machine gave; every measurement is kept (``machine.read_bandwidth_runs_gbs``)."""
    device = model_device(model)
    runs = [*earlier, read_bandwidth(device=device)]
    bandwidth = max(runs)
    summary["machine"]["read_bandwidth_gbs"] = round(bandwidth / 1e9, 2)
    summary["machine"]["read_bandwidth_runs_gbs"] = [round(b / 1e9, 2) for b in runs]
    summary["roofline"] = roofline(
        records, bandwidth=bandwidth, full_forward_bytes=model_bytes(model), device=device.type
    )
    choices: dict[str, Any] = {}
    for r in records:
        for what, c in (r.get("choices") or {}).items():
            choices.setdefault(what, c)
    summary["choices"] = choices
