"""The OpenAI request bodies ``specdec serve`` accepts: parsed, checked, or refused by field.

:func:`parse_completion` and :func:`parse_chat` turn a decoded JSON body into a
:class:`Request`, or raise :class:`ApiError` (an OpenAI-style error body, status 400) naming
the first field that is malformed, out of range, unknown, or asks for something the host
cannot do exactly (``n`` > 1, ``logprobs``, tools, penalties, ...). :func:`parse_json` turns
the raw body into JSON, or a 400 for anything that is not plain JSON (malformed, not UTF-8,
``NaN``, an integer too long to read, arrays nested too deep). Text with a lone surrogate (which
no tokenizer can encode) is a 400 naming its field. Nothing here loads torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

#: OpenAI's limit on the number of stop strings.
MAX_STOP = 4
#: the default request-body bound: this many bytes per prompt token, and never under MIN_BODY_BYTES
BODY_BYTES_PER_TOKEN = 256
MIN_BODY_BYTES = 1 << 20
_SURROGATE = re.compile("[\ud800-\udfff]")


def default_max_body_bytes(max_prompt_tokens: int) -> int:
    """The body bound when ``--max-body-bytes`` is not given: room for a prompt of
    ``max_prompt_tokens`` tokens even where each is JSON-escaped to many bytes."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * max_prompt_tokens)


class ApiError(Exception):
    """An OpenAI-style error answer: ``status``, and the body's ``message``, ``type``,
    ``param`` (the offending field, or None) and ``code``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type: str = "invalid_request_error",
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Limits:
    """The server's bounds: ``max_tokens`` above ``max_tokens_limit`` or a prompt longer than
    ``max_prompt_tokens`` is a 400; ``default_max_tokens`` when a request gives none. A body
    longer than ``max_body_bytes`` is a 413 (None: :func:`default_max_body_bytes`)."""

    max_tokens_limit: int = 2048
    max_prompt_tokens: int = 4096
    default_max_tokens: int = 128
    max_body_bytes: int | None = None

    @property
    def body_bytes(self) -> int:
        return (
            self.max_body_bytes
            if self.max_body_bytes is not None
            else default_max_body_bytes(self.max_prompt_tokens)
        )


@dataclass(frozen=True)
class Defaults:
    """Sampling used where a request gives none (the server's ``--temperature`` and so on)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Request:
    """One checked request. ``prompt`` is text or token ids (completions); ``messages`` the
    chat messages (chat). ``seed`` is the host's :class:`selfspec.Sampling` seed."""

    kind: str  # "completion" or "chat"
    model: str
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ fields
_COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "user",
}
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT = _COMMON | {
    "messages",
    "max_completion_tokens",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "parallel_tool_calls",
    "response_format",
}
_ROLES = {"system", "developer", "user", "assistant"}


def parse_json(raw: bytes) -> Any:
    """The request body as JSON; :class:`ApiError` 400 for anything that is not plain JSON."""
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise ApiError(
            400, "the request body is not valid JSON: it nests arrays or objects too deep"
        ) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        why = (
            "it holds an integer with too many digits"
            if "integer string conversion" in str(exc)
            else str(exc)
        )
        raise ApiError(400, f"the request body is not valid JSON: {_short(why)}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def parse_completion(body: Any, limits: Limits, defaults: Defaults) -> Request:
    """``POST /v1/completions``' body -> :class:`Request` (``prompt``: text or token ids)."""
    body = _object(body, _COMPLETION)
    if body.get("echo") not in (None, False):
        raise _unsupported("echo", "echo=true is not supported")
    if body.get("best_of") not in (None, 1):
        raise _unsupported("best_of", "best_of > 1 is not supported (one sequence per request)")
    if body.get("suffix") not in (None, ""):
        raise _unsupported("suffix", "suffix (insertion) is not supported")
    if body.get("logprobs") is not None:
        raise _unsupported("logprobs", "logprobs are not supported")
    req = _common(body, "completion", limits, defaults, body.get("max_tokens"), "max_tokens")
    req.prompt = _prompt(body.get("prompt"))
    return req


def parse_chat(body: Any, limits: Limits, defaults: Defaults) -> Request:
    """``POST /v1/chat/completions``' body -> :class:`Request` (``messages``: role + text)."""
    body = _object(body, _CHAT)
    for name in ("tools", "functions"):
        if body.get(name) not in (None, []):
            raise _unsupported(name, f"{name} (function calling) are not supported")
    for name in ("tool_choice", "function_call"):
        if body.get(name) not in (None, "none"):
            raise _unsupported(name, f"{name} is not supported (no tools)")
    if body.get("parallel_tool_calls") is not None and not isinstance(
        body["parallel_tool_calls"], bool
    ):
        raise _type("parallel_tool_calls", "a boolean")
    if body.get("logprobs") not in (None, False):
        raise _unsupported("logprobs", "logprobs are not supported")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise _unsupported("response_format", 'only response_format {"type": "text"} is supported')
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise ApiError(
            400, "give max_tokens or max_completion_tokens, not both", "max_completion_tokens"
        )
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    req = _common(body, "chat", limits, defaults, body.get(name), name)
    req.messages = _messages(body.get("messages"))
    return req


# ------------------------------------------------------------------------------------------ helpers
def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {_json_type(body)}")
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"unrecognized request argument: {key}", key)
    return body


def _common(
    body: dict[str, Any],
    kind: str,
    limits: Limits,
    defaults: Defaults,
    max_tokens: Any,
    max_name: str,
) -> Request:
    model = body.get("model")
    if not isinstance(model, str):
        raise (
            _type("model", "a string")
            if "model" in body
            else ApiError(400, "model is required", "model")
        )
    _text(model, "model")
    if body.get("n") not in (None, 1) or isinstance(body.get("n"), bool):
        raise _unsupported("n", "n must be 1 (one choice per request)")
    if body.get("top_logprobs") is not None:
        raise _unsupported("top_logprobs", "logprobs are not supported")
    for name in ("presence_penalty", "frequency_penalty"):
        value = _number(body, name, -2.0, 2.0)
        if value not in (None, 0.0):
            raise _unsupported(
                name, f"{name} is not supported (it would change the model's distribution)"
            )
    if body.get("logit_bias") not in (None, {}):
        raise _unsupported("logit_bias", "logit_bias is not supported")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _type("user", "a string")
    if body.get("user") is not None:
        _text(body["user"], "user")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _type("stream", "a boolean")
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise ApiError(
                400, "stream_options is only allowed when stream is true", "stream_options"
            )
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise _type("stream_options", "an object with include_usage only")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise _type("stream_options.include_usage", "a boolean")
    if max_tokens is None:
        max_tokens = limits.default_max_tokens
    elif not _is_int(max_tokens):
        raise _type(max_name, "an integer")
    if not 1 <= max_tokens <= limits.max_tokens_limit:
        raise ApiError(
            400,
            f"{max_name} must lie in [1, {limits.max_tokens_limit}] on this server, "
            f"got {max_tokens}",
            max_name,
        )
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "top_p must be > 0", "top_p")
    top_k = body.get("top_k")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise ApiError(400, "top_k must be an integer >= 0 (0: no top-k filter)", "top_k")
    seed = body.get("seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**64):
        raise ApiError(400, "seed must be an integer in [0, 2**64)", "seed")
    return Request(
        kind=kind,
        model=model,
        max_tokens=int(max_tokens),
        temperature=defaults.temperature if temperature is None else temperature,
        top_k=defaults.top_k if top_k is None else int(top_k),
        top_p=defaults.top_p if top_p is None else top_p,
        seed=defaults.seed if seed is None else int(seed),
        stop=_stop(body.get("stop")),
        stream=bool(stream),
        include_usage=include_usage,
    )


def _prompt(prompt: Any) -> str | list[int]:
    if prompt is None:
        raise ApiError(400, "prompt is required", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError(400, "prompt is empty", "prompt")
        return _text(prompt, "prompt")
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        return [int(t) for t in prompt]
    if (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(p, (str, list)) for p in prompt)
    ):
        raise _unsupported("prompt", "one prompt per request (a batch of several is not supported)")
    raise _type("prompt", "a non-empty string or a non-empty list of token ids")


def _messages(messages: Any) -> list[dict[str, str]]:
    if messages is None:
        raise ApiError(400, "messages is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _type("messages", "a non-empty array")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _type(where, "an object")
        for key in m:
            if key not in ("role", "content", "name"):
                raise _unsupported(f"{where}.{key}", f"{where}.{key} is not supported")
        role = m.get("role")
        if role == "tool":
            raise _unsupported(f"{where}.role", "tool messages are not supported (no tools)")
        if role not in _ROLES:
            raise ApiError(
                400, f"{where}.role must be one of {', '.join(sorted(_ROLES))}", f"{where}.role"
            )
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _content(m.get("content"), where),
            }
        )
    return out


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return _text(content, f"{where}.content")
    if isinstance(content, list):  # content parts: text only
        texts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise _unsupported(f"{where}.content[{j}]", "only text content parts are supported")
            texts.append(_text(part["text"], f"{where}.content[{j}].text"))
        return "".join(texts)
    raise _type(f"{where}.content", "a string or an array of text parts")


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _type("stop", "a string or an array of strings")
    if len(stop) > MAX_STOP:
        raise ApiError(400, f"stop holds at most {MAX_STOP} strings", "stop")
    if any(not s for s in stop):
        raise ApiError(400, "stop strings must not be empty", "stop")
    for s in stop:
        _text(s, "stop")
    return tuple(stop)


def _text(text: str, param: str) -> str:
    """``text``, or a 400 naming ``param`` when it holds a lone surrogate (not Unicode text)."""
    if not text.isascii():
        m = _SURROGATE.search(text)
        if m:
            raise ApiError(
                400,
                f"{param} is not valid Unicode text: it holds a lone surrogate "
                f"(\\u{ord(m[0]):04x}) at character {m.start()}",
                param,
            )
    return text


def _number(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _type(name, "a number")
    if not lo <= value <= hi:
        raise ApiError(400, f"{name} must lie in [{lo:g}, {hi:g}], got {value}", name)
    return float(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value: Any) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
    }.get(type(value), "a number")


def _type(param: str, expected: str) -> ApiError:
    return ApiError(400, f"{param} must be {expected}", param)


def _unsupported(param: str, message: str) -> ApiError:
    return ApiError(
        400,
        f"{message}: selfspec serves one exact decode per request",
        param,
        code="unsupported_parameter",
    )
