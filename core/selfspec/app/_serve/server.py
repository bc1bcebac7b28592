"""Running the server: bind, load on the worker thread, serve with uvicorn, stop cleanly.

:func:`bind` takes the address first (a taken port fails at once, and the line saying where
the server listens is true); :func:`serve` starts the :class:`~selfspec.app._serve.worker.Worker`
(model load, decoder setup and warm-up, each said on stderr) and runs uvicorn until SIGTERM or
Ctrl-C. Then the listener stays open while the server drains: new requests and queued ones are
answered 503 (``/health`` too), the running decode finishes, or after the grace (``GRACE_S``
by default) is cancelled at its next step and its client gets a 503 error (a stream: an error
event, then ``[DONE]``); once no answer is in flight uvicorn closes, and the process exits with
status 0. A second Ctrl-C stops at once.
"""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from selfspec.app._serve.app import build_app
from selfspec.app._serve.protocol import Defaults, Limits
from selfspec.app._serve.worker import SHUTDOWN, Worker

#: seconds a running decode may take to finish after SIGTERM/Ctrl-C before it is cancelled
GRACE_S = 30
#: seconds a cancelled decode and the answers still being sent may take after the grace
TAIL_S = 10
PREFIX = "specdec serve: "


def serve(
    settings: Any,
    sock: socket.socket,
    *,
    api_key: str | None,
    queue_size: int,
    limits: Limits,
    defaults: Defaults,
    allowed_hosts: list[str] | None = None,
    cors_origins: tuple[str, ...] = (),
    specials_as_text: bool = True,
    grace_s: float = GRACE_S,
    log: Callable[[str], None] | None = None,
) -> int:
    """Serve ``settings``' model and plugin on the listening ``sock`` (:func:`bind`) until
    stopped; the exit status (0, or 1 when the model could not be loaded). ``allowed_hosts``
    None: :func:`default_allowed_hosts`."""
    import uvicorn

    say = log or (lambda line: print(PREFIX + line, file=sys.stderr, flush=True))
    url = _url(sock)
    where = (
        "this machine only; --host 0.0.0.0 serves other machines"
        if _loopback(sock)
        else "reachable from other machines"
    )
    say(f"listening on {url} ({where}); /health answers 200 once the model is ready")
    if api_key is None and not _loopback(sock):
        say("warning: no --api-key: anyone who can reach this address can use the model")
    if allowed_hosts is None:
        allowed_hosts = default_allowed_hosts(sock)
    if allowed_hosts is None or "*" in allowed_hosts:
        say("the Host header is not checked (--allowed-hosts names the host names clients use)")

    holder: dict[str, Any] = {}
    worker = Worker(
        lambda progress: _load(settings, progress),
        queue_size,
        say,
        on_failure=lambda: setattr(holder["server"], "should_exit", True),
        ready_line=f"ready: {settings.plugin_name} on POST {url}/v1/chat/completions "
        "and /v1/completions",
    )
    app = build_app(
        worker,
        limits,
        defaults,
        api_key,
        allowed_hosts=allowed_hosts,
        cors_origins=cors_origins,
        specials_as_text=specials_as_text,
        log=say,
    )
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=TAIL_S, lifespan="off"
    )
    server = _Server(config, worker, app, grace_s, say)
    holder["server"] = server
    worker.start()
    try:
        server.run(sockets=[sock])
    finally:
        worker.stop()
        sock.close()
    if worker.state == "failed":
        return 1
    say("stopped")
    return 0


def default_allowed_hosts(sock: socket.socket) -> list[str] | None:
    """The bound address and ``localhost``; None (any host) for a wildcard address, which
    answers on every address the machine has."""
    address = sock.getsockname()[0]
    try:
        if ipaddress.ip_address(address).is_unspecified:
            return None
    except ValueError:
        pass
    return [address, "localhost"]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one). ``OSError`` if taken."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class _Server:
    """uvicorn's server whose signal handler drains before uvicorn closes: the worker refuses
    new and queued requests (503) while the listener stays open, the running decode finishes or
    is cancelled after ``grace_s``, and uvicorn is told to exit once no answer is in flight.
    It exits with status 0 after a signal (uvicorn re-raises it by default)."""

    def __new__(
        cls, config: Any, worker: Worker, app: Any, grace_s: float, say: Callable[[str], None]
    ) -> Any:
        import uvicorn

        def idle() -> bool:
            return not worker.busy() and app.in_flight == 0

        def wait(seconds: float) -> None:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not idle():
                time.sleep(0.05)

        class Server(uvicorn.Server):
            draining = False

            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                if self.draining or self.should_exit:
                    if sig == signal.SIGINT:
                        self.force_exit = self.should_exit = True
                    return
                say(f"{signal.Signals(sig).name}: finishing the running request, refusing new ones")
                self.draining = True
                worker.begin_stop()
                threading.Thread(target=self._drain, name="selfspec-drain", daemon=True).start()

            def _drain(self) -> None:
                wait(grace_s)
                running = worker.running
                if running is not None:
                    say(f"{running.id}: cancelled, the {grace_s:g} s grace is over")
                    running.cancel(SHUTDOWN)
                wait(TAIL_S)
                self.should_exit = True

        return Server(config)


# ------------------------------------------------------------------------------------------ loading
def _load(settings: Any, progress: Callable[[str], None]) -> tuple[Any, Any]:
    """On the worker thread: the model, the decoder (the plugin's setup) and one warm-up decode."""
    from selfspec.app._cli.settings import user_errors

    t0 = time.perf_counter()
    progress(f"loading the model ({settings.model or 'the embedded default'}) ...")
    with user_errors():
        loaded = settings.load_model()
        t1 = time.perf_counter()
        progress(
            f"model {loaded.name} loaded in {t1 - t0:.1f} s "
            f"({str(loaded.dtype).removeprefix('torch.')}, "
            f"{loaded.device}, {settings.thread_choice.threads} threads)"
        )
        progress(
            f"setting up the {settings.plugin_name} decoder (weight layout, draft weights, "
            "artefacts) ..."
        )
        decoder = settings.decoder(loaded, adopt_weights=True)
    t2 = time.perf_counter()
    progress(
        f"decoder ready in {t2 - t1:.1f} s (weight layout {decoder.runner.weight_layout}, "
        f"options {decoder.options})"
    )
    ids = loaded.tokenizer.encode("Hello") or [0]
    decoder.generate(ids, 4, loaded.eos_token_ids)
    progress(f"warm-up decode done in {time.perf_counter() - t2:.1f} s")
    return loaded, decoder


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _loopback(sock: socket.socket) -> bool:
    try:
        return ipaddress.ip_address(sock.getsockname()[0]).is_loopback
    except ValueError:
        return False
