"""The ASGI application: OpenAI's routes over one :class:`~selfspec.app._serve.worker.Worker`.

``GET /health`` (200 only when the model is ready), ``GET /v1/models``, ``POST
/v1/completions`` and ``POST /v1/chat/completions``, streamed (server-sent events: one chunk
per committed block that adds text, the last one with ``finish_reason`` and the ``selfspec``
stats, then ``[DONE]``) or not. With an API key every ``/v1`` route wants
``Authorization: Bearer KEY`` (401 otherwise). Errors are OpenAI's error body.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from selfspec.app._serve.protocol import (
    ApiError,
    Defaults,
    Limits,
    Request,
    parse_chat,
    parse_completion,
)
from selfspec.app._serve.worker import Job, Outcome, Worker

#: how often a non-streaming request checks whether its client is still there (seconds)
DISCONNECT_POLL_S = 0.25


def build_app(worker: Worker, limits: Limits, defaults: Defaults, api_key: str | None = None) -> Starlette:
    """The Starlette app serving ``worker``'s model with these bounds and sampling defaults."""
    created = int(time.time())

    async def health(request: HttpRequest) -> Response:
        body = {**worker.health(), "model": _model_id(worker), "plugin": _plugin(worker)}
        return JSONResponse(body, status_code=200 if worker.state == "ready" else 503)

    async def models(request: HttpRequest) -> Response:
        _authorize(request, api_key)
        if worker.state != "ready":
            raise worker.unavailable()
        return JSONResponse({"object": "list", "data": [
            {"id": _model_id(worker), "object": "model", "created": created, "owned_by": "selfspec",
             "selfspec": {"plugin": _plugin(worker), "options": _jsonable(worker.decoder.options)}}]})

    async def completions(request: HttpRequest) -> Response:
        return await _answer(request, parse_completion)

    async def chat(request: HttpRequest) -> Response:
        return await _answer(request, parse_chat)

    async def _answer(request: HttpRequest, parse: Any) -> Response:
        _authorize(request, api_key)
        req: Request = parse(await _json_body(request), limits, defaults)
        if worker.state != "ready":
            raise worker.unavailable()
        if req.model != _model_id(worker):
            raise ApiError(404, f"the model {req.model!r} does not exist: this server serves {_model_id(worker)!r} "
                           "(GET /v1/models)", "model", code="model_not_found")
        prompt_ids = _encode(worker, req, limits)
        from selfspec._engine.sampling import Sampling

        loop = asyncio.get_running_loop()
        job = Job(prompt_ids, req.max_tokens, Sampling(req.temperature, req.top_k, req.top_p, req.seed), req.stop,
                  loop, asyncio.Queue(), kind=req.kind)
        worker.submit(job)
        if req.stream:
            return StreamingResponse(_sse(job, req, _model_id(worker)), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        done = False
        try:
            while True:
                try:
                    kind, payload = await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        job.cancel("client disconnected")
                        return Response(status_code=499)
                    continue
                if kind == "error":
                    done = True
                    raise payload
                if kind == "done":
                    done = True
                    return JSONResponse(_full(req, job.id, _model_id(worker), payload))
        finally:
            if not done:  # the request ended first (its task was cancelled): stop the decode
                job.cancel("request ended")

    async def api_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    async def http_error(request: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        status = exc.status_code
        message = f"{request.method} {request.url.path}: " + (
            "no such route" if status == 404 else "method not allowed" if status == 405 else str(exc.detail))
        return JSONResponse(ApiError(status, message).body(), status_code=status, headers=exc.headers)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error})


# ---------------------------------------------------------------------------------------------- requests
def _authorize(request: HttpRequest, api_key: str | None) -> None:
    if api_key is None:
        return
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(401, "a wrong or missing API key: send Authorization: Bearer KEY (the server's --api-key)",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def _json_body(request: HttpRequest) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}") from None


def _encode(worker: Worker, req: Request, limits: Limits) -> list[int]:
    """The prompt's token ids (the chat template for chat), or a 400 when over the bound."""
    tok = worker.loaded.tokenizer
    with worker.tokenizer_lock:
        if req.kind == "chat":
            if not getattr(tok, "chat_template", None):
                raise ApiError(400, f"the model {_model_id(worker)!r} has no chat template: use /v1/completions",
                               "messages")
            try:
                ids = tok.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
            except Exception as exc:  # noqa: BLE001  (a template that rejects the conversation)
                raise ApiError(400, f"the chat template rejects these messages: {exc}", "messages") from None
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = list(ids)
            if ids and isinstance(ids[0], list):
                ids = ids[0]
        elif isinstance(req.prompt, str):
            ids = tok.encode(req.prompt)
        else:
            ids = list(req.prompt or [])
            vocab = worker.decoder.runner.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise ApiError(400, f"prompt token ids must lie in [0, {vocab})", "prompt")
    ids = [int(i) for i in ids]
    param = "messages" if req.kind == "chat" else "prompt"
    if not ids:
        raise ApiError(400, "the prompt encodes to no tokens", param)
    if len(ids) > limits.max_prompt_tokens:
        raise ApiError(400, f"the prompt is {len(ids)} tokens; this server takes at most {limits.max_prompt_tokens}",
                       param, code="context_length_exceeded")
    return ids


# ---------------------------------------------------------------------------------------------- answers
def _full(req: Request, job_id: str, model: str, out: Outcome) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
    if req.kind == "chat":
        choice["message"] = {"role": "assistant", "content": out.text}
    else:
        choice["text"] = out.text
    return {"id": _response_id(req, job_id), "object": "chat.completion" if req.kind == "chat" else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": _usage(out),
            "system_fingerprint": None, "selfspec": out.stats}


async def _sse(job: Job, req: Request, model: str) -> AsyncIterator[str]:
    """Server-sent events: a chunk per block of new text, the finishing chunk, ``[DONE]``."""
    rid, created = _response_id(req, job.id), int(time.time())
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"

    def chunk(delta: str | None, finish: str | None = None, **extra: Any) -> str:
        if req.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {} if delta is None else {"content": delta},
                                      "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], **extra}
        return f"data: {json.dumps(body)}\n\n"

    done = False
    try:
        if req.kind == "chat":  # OpenAI's first chunk names the role
            yield (f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': model, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'logprobs': None, 'finish_reason': None}]})}\n\n")
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
                    body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                            "usage": _usage(payload)}
                    yield f"data: {json.dumps(body)}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:
        if not done:  # the client went away (or the server is stopping): end the decode at its next step
            job.cancel("client disconnected")


def _usage(out: Outcome) -> dict[str, int]:
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens,
            "total_tokens": out.prompt_tokens + out.completion_tokens}


def _response_id(req: Request, job_id: str) -> str:
    return f"{'chatcmpl' if req.kind == 'chat' else 'cmpl'}-{job_id}-{uuid.uuid4().hex[:8]}"


def _model_id(worker: Worker) -> str | None:
    return worker.loaded.name if worker.loaded is not None else None


def _plugin(worker: Worker) -> str | None:
    return worker.decoder.plugin_name if worker.decoder is not None else None


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
