#!/usr/bin/env python3
"""How long a ``specdec`` process takes from start to exit, for versions of the code side by side.

    python lab/scripts/setup_time.py --variant before=/path/to/old/checkout --variant after=. \
        --plugins vanilla,qspec,selfsd --model qwen2.5-coder-1.5b --rounds 3 -n 16

Each variant is a checkout whose ``core`` and ``plugins/*`` directories go first on
``PYTHONPATH`` (so the installed command runs that checkout's code); each round runs every
plugin under every variant once, interleaved, after one warm-up round that is not counted (it
fills the calibration caches and the page cache). Per run: the process's wall time, the
decode's own seconds (from ``--json`` stats: prefill and decode) and their difference (the
set-up: imports, loading, layouts, draft copies, measured choices read from the cache).
Prints a markdown table of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def pythonpath(checkout: Path) -> str:
    parts = [checkout / "core", *sorted(p for p in (checkout / "plugins").iterdir() if p.is_dir())]
    return os.pathsep.join(str(p) for p in parts)


def run_once(checkout: Path, plugin: str, model: str, tokens: int, prompt: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath(checkout)}
    specdec = Path(sys.executable).with_name("specdec")
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(specdec), "-p", plugin, "-m", model, "-n", str(tokens), "--json", prompt],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{plugin} under {checkout} failed: {done.stderr[-500:]}")
    stats = json.loads(done.stdout[done.stdout.index("{") :])["stats"]
    return {"wall": wall, "decode": stats["wall_time_s"], "setup": wall - stats["wall_time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="NAME=CHECKOUT")
    ap.add_argument("--plugins", default="vanilla,qspec")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="def fib(n):")
    ap.add_argument("--json", type=Path, help="write every run here")
    args = ap.parse_args()
    variants = {
        name: Path(path).resolve() for name, _, path in (v.partition("=") for v in args.variant)
    }
    plugins = args.plugins.split(",")
    runs: dict[tuple[str, str], list[dict[str, float]]] = {
        (v, p): [] for v in variants for p in plugins
    }
    for r in range(args.rounds + 1):
        for p in plugins:
            for v, checkout in variants.items():
                out = run_once(checkout, p, args.model, args.max_new_tokens, args.prompt)
                print(
                    f"round {r}{' (warm-up)' if r == 0 else ''}: {p} {v}: {out['wall']:.1f} s "
                    f"(set-up {out['setup']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                if r:
                    runs[(v, p)].append(out)
    print("| plugin | variant | process, s | set-up, s | decode, s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for p in plugins:
        for v in variants:
            rs = runs[(v, p)]
            med = {k: statistics.median(x[k] for x in rs) for k in ("wall", "setup", "decode")}
            print(f"| `{p}` | {v} | {med['wall']:.1f} | {med['setup']:.1f} | {med['decode']:.1f} |")
    if args.json:
        args.json.write_text(
            json.dumps({f"{v}/{p}": rs for (v, p), rs in runs.items()}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
