"""The server's request checks and its text assembly, without a model.

a) A valid body becomes a Request with the server's defaults filled in; every malformed,
   out-of-range, unknown or unsupported field is a 400 whose error body names that field.
b) TextAssembler hands out each block's new text, holds back an incomplete character and a
   tail that may start a stop string, and cuts the text before the first stop string.
c) A body that is not plain JSON and text with a lone surrogate are 400s; the body bound
   follows the prompt bound unless given.
d) The Guard checks Host, Origin and the key before any route, answers an allowed origin's
   CORS preflight, and turns an unexpected error into a 500 in OpenAI's shape, said in one line.
"""

from __future__ import annotations

import pytest

from selfspec.app._serve.protocol import (
    ApiError,
    Defaults,
    Limits,
    parse_chat,
    parse_completion,
    parse_json,
)
from selfspec.app._serve.text import TextAssembler

LIMITS = Limits(max_tokens_limit=100, max_prompt_tokens=50, default_max_tokens=16)
DEFAULTS = Defaults(temperature=0.0, top_k=0, top_p=1.0, seed=0)
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


def test_defaults_fill_what_a_request_leaves_out():  # see a)
    req = parse_chat(CHAT, LIMITS, Defaults(temperature=0.5, top_k=3, top_p=0.9, seed=4))
    assert (req.max_tokens, req.temperature, req.top_k, req.top_p, req.seed) == (16, 0.5, 3, 0.9, 4)
    req = parse_chat(
        {**CHAT, "temperature": 0, "seed": 9, "max_completion_tokens": 5, "stop": "x"},
        LIMITS,
        DEFAULTS,
    )
    assert (req.temperature, req.seed, req.max_tokens, req.stop) == (0.0, 9, 5, ("x",))


def test_a_completion_takes_text_or_token_ids():  # see a)
    assert parse_completion(COMPLETION, LIMITS, DEFAULTS).prompt == "hi"
    assert parse_completion({**COMPLETION, "prompt": ["hi"]}, LIMITS, DEFAULTS).prompt == "hi"
    assert parse_completion({**COMPLETION, "prompt": [1, 2]}, LIMITS, DEFAULTS).prompt == [1, 2]


def test_chat_content_parts_and_roles():  # see a)
    req = parse_chat(
        {
            **CHAT,
            "messages": [
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        },
        LIMITS,
        DEFAULTS,
    )
    assert req.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]


BAD = [
    ([], None),
    ({**CHAT, "max_tokens": "10"}, "max_tokens"),
    ({**CHAT, "max_tokens": 0}, "max_tokens"),
    ({**CHAT, "max_tokens": 101}, "max_tokens"),
    ({**CHAT, "max_tokens": True}, "max_tokens"),
    ({**CHAT, "max_tokens": 5, "max_completion_tokens": 5}, "max_completion_tokens"),
    ({**CHAT, "temperature": "hot"}, "temperature"),
    ({**CHAT, "temperature": 2.5}, "temperature"),
    ({**CHAT, "top_p": 0}, "top_p"),
    ({**CHAT, "top_k": -1}, "top_k"),
    ({**CHAT, "seed": -1}, "seed"),
    ({**CHAT, "seed": 1.5}, "seed"),
    ({**CHAT, "stop": 5}, "stop"),
    ({**CHAT, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**CHAT, "stop": [""]}, "stop"),
    ({**CHAT, "stream": "yes"}, "stream"),
    ({**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ({**CHAT, "n": 2}, "n"),
    ({**CHAT, "logprobs": True}, "logprobs"),
    ({**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({**CHAT, "tool_choice": "auto"}, "tool_choice"),
    ({**CHAT, "functions": [{"name": "f"}]}, "functions"),
    ({**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    ({**CHAT, "presence_penalty": 0.5}, "presence_penalty"),
    ({**CHAT, "logit_bias": {"5": 1}}, "logit_bias"),
    ({**CHAT, "frobnicate": 1}, "frobnicate"),
    ({"messages": CHAT["messages"]}, "model"),
    ({**CHAT, "model": 3}, "model"),
    ({**CHAT, "messages": "hi"}, "messages"),
    ({**CHAT, "messages": []}, "messages"),
    ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({**CHAT, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content[0]",
    ),
]


@pytest.mark.parametrize("body, param", BAD)
def test_a_bad_chat_body_is_a_400_naming_the_field(body, param):  # see a)
    with pytest.raises(ApiError) as err:
        parse_chat(body, LIMITS, DEFAULTS)
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["param"] == param and err.value.body()["error"]["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m"}, "prompt"),
        ({**COMPLETION, "prompt": ""}, "prompt"),
        ({**COMPLETION, "prompt": ["a", "b"]}, "prompt"),
        ({**COMPLETION, "prompt": 5}, "prompt"),
        ({**COMPLETION, "logprobs": 2}, "logprobs"),
        ({**COMPLETION, "echo": True}, "echo"),
        ({**COMPLETION, "best_of": 2}, "best_of"),
        ({**COMPLETION, "suffix": "x"}, "suffix"),
        ({**COMPLETION, "messages": []}, "messages"),
    ],
)
def test_a_bad_completion_body_is_a_400_naming_the_field(body, param):  # see a)
    with pytest.raises(ApiError) as err:
        parse_completion(body, LIMITS, DEFAULTS)
    assert err.value.status == 400 and err.value.param == param


class CharTokenizer:
    """One token per character; id 0 is a special token (skipped), 1 half a character."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join("" if i == 0 else "\ufffd" if i == 1 else chr(i) for i in ids)


def _ids(text):
    return [ord(c) for c in text]


def test_blocks_come_out_as_they_are_committed():  # see b)
    a = TextAssembler(CharTokenizer())
    assert a.push(_ids("ab")) == ("ab", False)
    assert a.push([0]) == ("", False)
    assert a.push([1]) == ("", False)  # an incomplete character waits
    assert a.push(_ids("c")) == ("\ufffdc", False)
    assert a.finish() == "" and a.text == "ab\ufffdc"


def test_a_stop_string_cuts_the_text_and_ends_the_decode():  # see b)
    a = TextAssembler(CharTokenizer(), ("END", "xyz"))
    assert a.push(_ids("hello E")) == ("hello ", False)  # "E" may start "END": held back
    assert a.push(_ids("N")) == ("", False)
    assert a.push(_ids("Xtra E")) == ("ENXtra ", False)  # it did not
    assert a.push(_ids("ND more")) == ("", True)
    assert a.text == "hello ENXtra " and a.finish() == "" and a.push(_ids("z")) == ("", True)


def test_a_held_back_tail_comes_out_at_the_end():  # see b)
    a = TextAssembler(CharTokenizer(), ("END",))
    assert a.push(_ids("abcEN")) == ("abc", False)
    assert a.finish() == "EN" and a.text == "abcEN" and not a.stopped


def test_the_earliest_stop_string_wins_within_one_block():  # see b)
    a = TextAssembler(CharTokenizer(), ("yz", "b"))
    assert a.push(_ids("abxyz")) == ("a", True)


# ------------------------------------------------------------------------------------------ bodies
@pytest.mark.parametrize(
    "raw",
    [
        b'{"max_tokens": ' + b"9" * 5000 + b"}",
        b"[" * 5000 + b"]" * 5000,
        b'{"temperature": NaN}',
        b'{"temperature": Infinity}',
        b'{"model": "\xff"}',
        b"{not json",
    ],
    ids=[
        "a 5000-digit integer",
        "arrays nested 5000 deep",
        "NaN",
        "Infinity",
        "bad UTF-8",
        "malformed",
    ],
)
def test_a_body_that_is_not_plain_json_is_a_400(raw):  # see c)
    with pytest.raises(ApiError) as err:
        parse_json(raw)
    assert err.value.status == 400 and err.value.body()["error"]["message"].startswith(
        "the request body is not"
    )


@pytest.mark.parametrize(
    "body, parse, param",
    [
        ({**COMPLETION, "prompt": "a\udfffb"}, parse_completion, "prompt"),
        (
            {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]},
            parse_chat,
            "messages[0].content",
        ),
        (
            {
                **CHAT,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}],
            },
            parse_chat,
            "messages[0].content[0].text",
        ),
        ({**CHAT, "stop": ["ok", "\udfff"]}, parse_chat, "stop"),
        ({**CHAT, "model": "m\udfff"}, parse_chat, "model"),
    ],
)
def test_text_with_a_lone_surrogate_is_a_400_naming_the_field(body, parse, param):  # see c)
    with pytest.raises(ApiError) as err:
        parse(body, LIMITS, DEFAULTS)
    assert err.value.status == 400 and err.value.param == param


def test_the_body_bound_follows_the_prompt_bound_unless_given():  # see c)
    assert Limits(max_prompt_tokens=4096).body_bytes == 1 << 20
    assert Limits(max_prompt_tokens=32768).body_bytes == 256 * 32768
    assert Limits(max_prompt_tokens=4096, max_body_bytes=10).body_bytes == 10


# ------------------------------------------------------------------------------------------ guard
def _guarded(**kw):
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from selfspec.app._serve.guard import Guard

    async def ok(request):
        return PlainTextResponse("ok")

    routed = Starlette(routes=[Route("/health", ok), Route("/v1/models", ok)])

    async def app(scope, receive, send):
        if scope["path"] == "/v1/boom":
            raise RuntimeError("a secret detail")
        await routed(scope, receive, send)

    lines = []
    guard = Guard(app, log=lines.append, **{"api_key": None, "allowed_hosts": ["testserver"], **kw})
    return TestClient(guard, raise_server_exceptions=False), lines


def test_the_guard_checks_host_origin_and_key_before_routing():  # see d)
    pytest.importorskip("starlette")
    client, _ = _guarded(api_key="k", cors_origins=["http://app.example"])
    assert client.get("/health").status_code == 200
    for path in ("/v1/models", "/v1/nowhere", "/elsewhere"):
        assert client.get(path).json()["error"]["code"] == "invalid_api_key"
    assert client.delete("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer k"}).status_code == 200
    assert (
        client.get("/health", headers={"Host": "rebound.example"}).json()["error"]["code"]
        == "host_not_allowed"
    )
    refused = client.get("/health", headers={"Origin": "http://evil.example"})
    assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
    allowed = client.get(
        "/v1/models", headers={"Origin": "http://app.example", "Authorization": "Bearer k"}
    )
    assert allowed.headers["access-control-allow-origin"] == "http://app.example"
    preflight = client.options(
        "/v1/models",
        headers={"Origin": "http://app.example", "Access-Control-Request-Method": "GET"},
    )
    assert preflight.status_code == 204  # before the key: a browser's preflight carries none


def test_an_unexpected_error_is_a_500_in_openai_shape_without_its_detail():  # see d)
    pytest.importorskip("starlette")
    client, lines = _guarded()
    r = client.get("/v1/boom")
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "secret" not in r.text and "Traceback" not in r.text
    assert lines == ["internal error on GET /v1/boom: RuntimeError: a secret detail"]


def test_any_host_is_answered_when_no_host_is_named():  # see d)
    pytest.importorskip("starlette")
    client, _ = _guarded(allowed_hosts=None)
    assert client.get("/health", headers={"Host": "anything.example"}).status_code == 200
