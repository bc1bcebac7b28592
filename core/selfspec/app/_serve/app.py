"""The ASGI application: OpenAI's routes over one :class:`~selfspec.app._serve.worker.Worker`.

``GET /health`` (200 only when the model is ready), ``GET /v1/models``, ``POST
/v1/completions`` and ``POST /v1/chat/completions``, streamed (server-sent events: one chunk
per committed block that adds text, the last one with ``finish_reason`` and the ``selfspec``
stats, then ``[DONE]``) or not. :class:`~selfspec.app._serve.guard.Guard` checks the Host,
the Origin and the API key before any route. A POST body must be ``application/json`` (415)
and at most ``Limits.body_bytes`` long (413, from ``Content-Length`` or while it is read); the
prompt is encoded off the event loop (:class:`~selfspec.app._serve.prompt.PromptEncoder`). A
streamed answer starts once its decode starts, so a request refused while it waited (the server
stopping) gets its own status. Errors are OpenAI's error body, a 500 included.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from selfspec.app._serve.guard import Guard, internal_error
from selfspec.app._serve.prompt import PromptEncoder
from selfspec.app._serve.protocol import (
    ApiError,
    Defaults,
    Limits,
    Request,
    parse_chat,
    parse_completion,
    parse_json,
)
from selfspec.app._serve.worker import Job, Outcome, Worker

#: how often a request waiting on its decode checks whether its client is still there (seconds)
DISCONNECT_POLL_S = 0.25


def build_app(
    worker: Worker,
    limits: Limits,
    defaults: Defaults,
    api_key: str | None = None,
    *,
    allowed_hosts: Iterable[str] | None = None,
    cors_origins: Iterable[str] = (),
    specials_as_text: bool = True,
    log: Callable[[str], None] | None = None,
) -> Guard:
    """The app serving ``worker``'s model with these bounds and sampling defaults, behind its
    :class:`Guard` (``allowed_hosts`` None: any ``Host``)."""
    created = int(time.time())
    encoders: list[PromptEncoder] = []

    def encoder() -> PromptEncoder:
        if not encoders:
            encoders.append(
                PromptEncoder(
                    worker.loaded.tokenizer,
                    worker.decoder.runner.vocab_size,
                    limits,
                    specials_as_text,
                    _model_id(worker),
                )
            )
        return encoders[0]

    async def health(request: HttpRequest) -> Response:
        body = {**worker.health(), "model": _model_id(worker), "plugin": _plugin(worker)}
        return JSONResponse(body, status_code=200 if worker.state == "ready" else 503)

    async def models(request: HttpRequest) -> Response:
        if worker.state != "ready":
            raise worker.unavailable()
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": _model_id(worker),
                        "object": "model",
                        "created": created,
                        "owned_by": "selfspec",
                        "selfspec": {
                            "plugin": _plugin(worker),
                            "options": _jsonable(worker.decoder.options),
                        },
                    }
                ],
            }
        )

    async def completions(request: HttpRequest) -> Response:
        return await _answer(request, parse_completion)

    async def chat(request: HttpRequest) -> Response:
        return await _answer(request, parse_chat)

    async def _answer(request: HttpRequest, parse: Any) -> Response:
        req: Request = parse(parse_json(await _body(request, limits.body_bytes)), limits, defaults)
        if worker.state != "ready":
            raise worker.unavailable()
        if req.model != _model_id(worker):
            raise ApiError(
                404,
                f"the model {req.model!r} does not exist: this server serves {_model_id(worker)!r} "
                "(GET /v1/models)",
                "model",
                code="model_not_found",
            )
        prompt_ids = await encoder().encode(req)
        from selfspec._engine.contract.sampling import Sampling

        loop = asyncio.get_running_loop()
        job = Job(
            prompt_ids,
            req.max_tokens,
            Sampling(req.temperature, req.top_k, req.top_p, req.seed),
            req.stop,
            loop,
            asyncio.Queue(),
            kind=req.kind,
        )
        worker.submit(job)
        handed_over = False
        try:
            while True:
                event = await _next_event(job, request)
                if event is None:  # the client went away
                    return Response(status_code=499)
                kind, payload = event
                if kind == "error":
                    handed_over = True
                    raise payload
                if kind == "started" and req.stream:
                    handed_over = True
                    return StreamingResponse(
                        _sse(job, req, _model_id(worker)),
                        media_type="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                    )
                if kind == "done":
                    handed_over = True
                    return JSONResponse(_full(req, job.id, _model_id(worker), payload))
        finally:
            if not handed_over:  # the request ended first (its task was cancelled, its client left)
                job.cancel("request ended")

    async def api_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        message = f"{request.method} {request.url.path}: " + (
            "no such route"
            if status == 404
            else "method not allowed"
            if status == 405
            else str(exc.detail)
        )
        return JSONResponse(
            ApiError(status, message).body(), status_code=status, headers=exc.headers
        )

    async def unexpected(request: HttpRequest, exc: Exception) -> Response:  # the Guard logs it
        return JSONResponse(internal_error().body(), status_code=500)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={ApiError: api_error, HTTPException: http_error, Exception: unexpected},
    )
    return Guard(
        app, api_key=api_key, allowed_hosts=allowed_hosts, cors_origins=cors_origins, log=log
    )


# ----------------------------------------------------------------------------------------- requests
async def _body(request: HttpRequest, bound: int) -> bytes:
    """The body of a JSON POST, at most ``bound`` bytes: 415 for another media type, 413 when
    ``Content-Length`` says more or the body turns out longer while it is read."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            f"the request body must be JSON, sent with Content-Type: application/json "
            f"(not {media or 'none'!r})",
            code="unsupported_media_type",
        )
    too_long = ApiError(
        413,
        f"the request body is longer than this server takes ({bound} bytes, --max-body-bytes)",
        code="request_too_large",
    )
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise ApiError(400, "Content-Length is not a number")
        if int(length) > bound:
            raise too_long
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > bound:
            raise too_long
        chunks.append(chunk)
    return b"".join(chunks)


async def _next_event(job: Job, request: HttpRequest) -> tuple[str, Any] | None:
    """The job's next event, or None (the job cancelled) once the client has gone away."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel("client disconnected")
                return None


# ------------------------------------------------------------------------------------------ answers
def _full(req: Request, job_id: str, model: str, out: Outcome) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
    if req.kind == "chat":
        choice["message"] = {"role": "assistant", "content": out.text}
    else:
        choice["text"] = out.text
    return {
        "id": _response_id(req, job_id),
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": _usage(out),
        "system_fingerprint": None,
        "selfspec": out.stats,
    }


async def _sse(job: Job, req: Request, model: str) -> AsyncIterator[str]:
    """Server-sent events: a chunk per block of new text, the finishing chunk, ``[DONE]``."""
    rid, created = _response_id(req, job.id), int(time.time())
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"

    def chunk(delta: str | None, finish: str | None = None, **extra: Any) -> str:
        if req.kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {} if delta is None else {"content": delta},
                "logprobs": None,
                "finish_reason": finish,
            }
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        body = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [choice],
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    done = False
    try:
        if req.kind == "chat":  # OpenAI's first chunk names the role
            first = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
            }
            yield f"data: {json.dumps(first)}\n\n"
        while True:
            kind, payload = await job.events.get()
            if kind == "delta":
                yield chunk(payload)
            elif kind == "error":
                done = True
                yield f"data: {json.dumps(payload.body())}\n\n"
                break
            else:
                done = True
                yield chunk(None, payload.finish_reason, selfspec=payload.stats)
                if req.include_usage:
                    body = {
                        "id": rid,
                        "object": obj,
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": _usage(payload),
                    }
                    yield f"data: {json.dumps(body)}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        if (
            not done
        ):  # the client went away (or the server is stopping): end the decode at its next step
            job.cancel("client disconnected")


def _usage(out: Outcome) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


def _response_id(req: Request, job_id: str) -> str:
    return f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{job_id}-{uuid.uuid4().hex[:8]}"


def _model_id(worker: Worker) -> str | None:
    return worker.loaded.name if worker.loaded is not None else None


def _plugin(worker: Worker) -> str | None:
    return worker.decoder.plugin_name if worker.decoder is not None else None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
