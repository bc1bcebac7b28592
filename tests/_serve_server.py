"""Helpers for the server's tests: a real ``specdec serve`` in a subprocess, and references.

:class:`ServerProcess` starts ``python -m selfspec serve --port 0 ...`` (a free loopback
port, read from the line that says where it listens), keeps its stderr lines, waits for
``/health`` to answer 200, reads its resident memory and stops it with a signal.
:func:`specdec_json` runs ``specdec ... --json PROMPT``; :func:`reference_decodes` decodes
many cases in one subprocess through the command line's own path (``Settings.load_model``,
``Settings.decoder(adopt_weights=True)``, the same prompt encoding).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

MODEL = "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[1]


class ServerProcess:
    def __init__(self, *args: str) -> None:
        self.args = args
        self.lines: list[str] = []
        self.url: str | None = None
        self.proc: subprocess.Popen[str] | None = None

    def start(self, timeout: float = 180.0) -> ServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "selfspec", "serve", "--port", "0", *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("specdec serve exited:\n" + "\n".join(self.lines))
            if self.url is not None:
                try:
                    if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        raise RuntimeError("specdec serve did not get ready:\n" + "\n".join(self.lines))

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            m = re.search(r"listening on (http://\S+)", line)
            if m and self.url is None:
                self.url = m[1]

    def wait_for_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                m = re.search(pattern, line)
                if m:
                    return m
            time.sleep(0.1)
        raise AssertionError(f"no stderr line matches {pattern!r}:\n" + "\n".join(self.lines))

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def rss_kib(self) -> int:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def specdec_json(*args: str) -> dict[str, Any]:
    """``specdec ARGS --json``'s one JSON object."""
    out = subprocess.run(
        [sys.executable, "-m", "selfspec", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


_REFERENCE = r"""
import json, sys
from selfspec import Sampling
from selfspec.app._cli.settings import Settings
from selfspec.app._models import format_prompt
plugin, threads = sys.argv[1], int(sys.argv[2])
settings = Settings(plugin=plugin, threads=threads, json=True)
loaded = settings.load_model()
decoder = settings.decoder(loaded, adopt_weights=True)
out = []
for case in json.loads(sys.stdin.read()):
    ids = (
        format_prompt(loaded, case["prompt"])
        if case["chat"]
        else loaded.tokenizer.encode(case["prompt"])
    )
    sampling = Sampling(
        case.get("temperature", 0.0),
        case.get("top_k", 0),
        case.get("top_p", 1.0),
        case.get("seed", 0),
    )
    r = decoder.generate(ids, case["max_tokens"], loaded.eos_token_ids, sampling=sampling)
    out.append({"text": r.text, "output_ids": r.output_ids, "prompt_ids": r.prompt_ids})
print(json.dumps(out))
"""


def reference_decodes(
    cases: list[dict[str, Any]], plugin: str, threads: int
) -> list[dict[str, Any]]:
    """Each case (``chat``, ``prompt``, ``max_tokens``, sampling fields) decoded as ``specdec``
    decodes it, all in one subprocess: ``text``, ``output_ids``, ``prompt_ids``."""
    out = subprocess.run(
        [sys.executable, "-c", _REFERENCE, plugin, str(threads)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
