"""The one model, its one decoder and the one thread that runs every decode.

:class:`Worker` loads the model and builds the decoder on its own thread (progress on stderr),
warms it up, then takes :class:`Job` s from a bounded queue in arrival order, one at a time
(batch size 1). A job's events (``started`` when its decode begins, ``delta`` text, then
``done`` or ``error``) reach the event loop through ``call_soon_threadsafe``. A cancelled job
(its client went away, the server is stopping) ends at the decode's next step, and its cache
goes with the finished decode; one cancelled because the server stops ends with a 503 error.
All torch work happens on this thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from selfspec.app._serve.protocol import ApiError
from selfspec.app._serve.text import TextAssembler

_IDS = itertools.count(1)
#: the cancel reason of a decode the server stops (it ends with a 503 error, not an answer)
SHUTDOWN = "server shutting down"


@dataclass
class Outcome:
    """A finished decode as the API reports it."""

    text: str
    finish_reason: str  # "stop" (EOS or a stop string), "length" (max_tokens), "cancelled"
    prompt_tokens: int
    completion_tokens: int
    stats: dict[str, Any]


@dataclass
class Job:
    """One request on its way through the worker: token ids, budget, sampling, stop strings;
    ``events`` (an ``asyncio.Queue`` of the request's event loop) receives its results."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: Any  # selfspec.Sampling
    stop: tuple[str, ...]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    kind: str = "completion"
    id: str = field(default_factory=lambda: f"req-{next(_IDS)}")
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

    def emit(self, kind: str, payload: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


class Worker:
    """Owns the model and decoder; runs jobs one by one on its thread.

    ``load``: a callable run on the worker thread that returns ``(loaded, decoder)``
    (``log`` receives progress lines). ``queue_size``: jobs that may wait behind the running
    one; one more is refused with 503 and ``Retry-After``. ``on_failure`` runs when loading
    failed; ``ready_line`` is logged once the model is ready.
    """

    def __init__(
        self,
        load: Callable[[Callable[[str], None]], tuple[Any, Any]],
        queue_size: int,
        log: Callable[[str], None] | None = None,
        on_failure: Callable[[], None] | None = None,
        ready_line: str = "ready",
    ) -> None:
        self.ready_line = ready_line
        self._load = load
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=queue_size)
        self.queue_size = queue_size
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.on_failure = on_failure
        self.state = "loading"  # -> "ready" -> "stopping"; "failed" when loading failed
        self.error = ""
        self.loaded: Any = None
        self.decoder: Any = None
        self.tokenizer_lock = threading.Lock()
        self.running: Job | None = None
        self.counts = {"completed": 0, "cancelled": 0, "failed": 0}
        self._thread = threading.Thread(target=self._main, name="selfspec-decode", daemon=True)

    # ------------------------------------------------------------------------------ event loop side
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``; :class:`ApiError` 503 when loading, stopping or the queue is full."""
        if self.state != "ready":
            raise self.unavailable()
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise ApiError(
                503,
                f"the server is busy: {self.queue_size} requests already wait behind the "
                "running one; retry later",
                type="server_busy",
                code="queue_full",
                headers={"Retry-After": str(1 + self.queue_size)},
            ) from None

    def unavailable(self) -> ApiError:
        if self.state == "loading":
            return ApiError(
                503,
                "the model is loading; retry when /health answers 200",
                type="server_busy",
                code="loading",
                headers={"Retry-After": "5"},
            )
        if self.state == "failed":
            return ApiError(
                503,
                f"the model could not be loaded: {self.error}",
                type="server_error",
                code="failed",
            )
        return ApiError(
            503, "the server is shutting down", type="server_busy", code="shutting_down"
        )

    def busy(self) -> bool:
        """Whether a decode runs or waits."""
        return self.running is not None or not self._queue.empty()

    def health(self) -> dict[str, Any]:
        return {
            "status": {"ready": "ok"}.get(self.state, self.state),
            "queued": self._queue.qsize(),
            "running": self.running is not None,
            **self.counts,
        }

    def begin_stop(self) -> None:
        """Refuse new jobs and answer the queued ones 503; the running one goes on."""
        if self.state in ("ready", "loading"):
            self.state = "stopping"
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.emit("error", self.unavailable())

    def stop(self, timeout: float = 30.0) -> None:
        """:meth:`begin_stop`, cancel the running job at its next step, wait for the thread."""
        self.begin_stop()
        if self.running is not None:
            self.running.cancel(SHUTDOWN)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------------------ worker thread
    def _main(self) -> None:
        try:
            self.loaded, self.decoder = self._load(self.log)
        except BaseException as exc:  # noqa: BLE001  (any failure: said in one line, the server stops)
            self.state, self.error = "failed", getattr(exc, "message", None) or _one_line(exc)
            self.log(f"error: {self.error}")
            if self.on_failure is not None:
                self.on_failure()
            return
        if self.state == "loading":
            self.state = "ready"
            self.log(self.ready_line)
        while True:
            job = self._queue.get()
            if job is None:
                return
            if job.cancelled.is_set():
                self._count(job, "cancelled", None)
                continue
            self.running = job
            job.emit("started", None)
            try:
                self._run(job)
            except BaseException as exc:  # noqa: BLE001  (one request's failure is its answer, not the server's end)
                self.counts["failed"] += 1
                self.log(f"{job.id} failed: {_one_line(exc)}")
                job.emit(
                    "error",
                    ApiError(500, f"the decode failed: {_one_line(exc)}", type="server_error"),
                )
            finally:
                self.running = None

    def _run(self, job: Job) -> None:
        assembler = TextAssembler(self.loaded.tokenizer, job.stop, self.tokenizer_lock)

        def stream(ids: list[int]) -> bool:
            delta, stopped = assembler.push(ids)
            if delta:
                job.emit("delta", delta)
            return stopped or job.cancelled.is_set()

        result = self.decoder.generate(
            job.prompt_ids,
            job.max_tokens,
            self.loaded.eos_token_ids,
            stream=stream,
            sampling=job.sampling,
        )
        tail = assembler.finish()
        if tail:
            job.emit("delta", tail)
        if assembler.respaced:
            self.log(
                f"{job.id}: the tokenizer re-spaced text already streamed; "
                "the streamed text differs from the final text"
            )
        out = result.output_ids
        if job.cancelled.is_set() and not assembler.stopped:
            reason = "cancelled"
        elif assembler.stopped or (out and out[-1] in self.loaded.eos_token_ids):
            reason = "stop"
        else:
            reason = "length"
        stats = {"plugin": self.decoder.plugin_name, **_stats(result.stats)}
        outcome = Outcome(assembler.text, reason, len(result.prompt_ids), len(out), stats)
        self._count(job, "cancelled" if reason == "cancelled" else "completed", outcome)
        if reason == "cancelled" and job.cancel_reason == SHUTDOWN:
            job.emit(
                "error",
                ApiError(
                    503,
                    f"the server stopped before this decode finished (after "
                    f"{outcome.completion_tokens} of {job.max_tokens} tokens)",
                    type="server_error",
                    code="shutting_down",
                ),
            )
            return
        job.emit("done", outcome)

    def _count(self, job: Job, what: str, outcome: Outcome | None) -> None:
        self.counts[what] += 1
        if outcome is None:
            self.log(f"{job.id} cancelled before it started ({job.cancel_reason})")
        elif what == "cancelled":
            self.log(
                f"{job.id} cancelled ({job.cancel_reason}) after {outcome.completion_tokens} "
                f"of {job.max_tokens} tokens"
            )
        else:
            s = outcome.stats
            self.log(
                f"{job.id} {job.kind}: {outcome.prompt_tokens} prompt + "
                f"{outcome.completion_tokens} tokens in {s['wall_time_s']:.2f} s "
                f"({s['tokens_per_s']:.1f} tok/s, "
                f"tau {s['tau']:.2f}), finish {outcome.finish_reason}"
            )


def _stats(stats: Any) -> dict[str, Any]:
    d = stats.as_dict()
    d.pop("phase_s", None)
    d.pop("accept_lengths", None)
    return d


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
