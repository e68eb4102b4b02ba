"""Running ``sgl-omni serve``: the port first, then the stages, then one line saying it is ready.

1. :func:`listen_socket` binds the port before anything loads (the CLI calls it before it even
   resolves the configuration, which may build the demo checkpoint): a port in use fails at once.
2. :func:`run_server` serves the app on that socket at once, and the stages load in the
   background meanwhile (``/health`` answers 503 ``starting``; requests get 503 saying so).
3. When every stage is ready it prints :func:`ready_line`: the playground's URL and a curl to
   try. A stage that fails to start stops the server (exit code 3), as before.
4. SIGTERM or SIGINT drains it (:mod:`.shutdown`): requests in flight get
   ``server.shutdown_grace_s`` seconds, then 503 "the server is shutting down"; the stages
   stop and the server exits 0 (also when the signal comes while the stages start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import time
from typing import Any

from sglang_omni.config.schema import ResolvedConfig
from sglang_omni.pipeline.process_setup import configure_logging, loop_watch

log = logging.getLogger("sglang_omni.serve")

#: The exit code of a server whose stages failed to start (uvicorn's own for a failed startup).
STARTUP_FAILED = 3
#: The exit code of a stage whose native processes stopped the server.
STOPPED = 1
#: A curl to try, per pipeline mode; ``{url}`` is the server's, ``{auth}`` the bearer header.
#: Each is silent (``-s``) and bounded: long lines (base64 media) are cut.
TRY = {
    "umm": """curl -sN {url}/generate -H 'Content-Type: application/json'{auth} -d '{{"prompt": \
"Draw a red cube, then describe it.", "stream": true, "include_progress": true}}' | cut -c1-150""",
    "chat": """curl -s {url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d \
'{{"messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'""",
    "generation": """curl -s {url}/v1/images/generations -H 'Content-Type: application/json'\
{auth} -d '{{"prompt": "a red cube", "size": "256x256"}}' | cut -c1-300""",
}
#: The interleaved pipeline with the scripted Reasoner answers a script
#: (docs/scripted-engines.md): this one makes an image, then answers.
TRY_SCRIPTED_UMM = """curl -sN {url}/generate -H 'Content-Type: application/json'{auth} -d \
'{{"prompt": "<omni-script>[{{\\"action\\": \\"image\\", \\"prompt\\": \\"a red cube\\"}}, \
{{\\"action\\": \\"final\\", \\"text\\": \\"I see {{media}}\\"}}]</omni-script> Draw a red cube.", \
"stream": true, "stage_params": {{"generation": {{"width": 256, "height": 256}}}}}}' \
| cut -c1-150"""


class PortInUse(OSError):
    """The address cannot be bound; the message says which and what to do."""


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening), or PortInUse naming the fix."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror}; check --host") \
            from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {(exc.strerror or str(exc)).lower()}; "
                        "stop the other server or choose another port (sgl-omni serve --port 8001, "
                        "make demo PORT=8001)") from None
    return sock


def display_url(host: str, port: int) -> str:
    """The URL a local browser opens: a wildcard host is shown as loopback."""
    shown = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def ready_line(mode: str, url: str, keyed: bool, seconds: float, *, scripted: bool = False,
               notice: str | None = None) -> str:
    """The one line printed when every stage is ready: ``scripted`` (the interleaved pipeline's
    Reasoner is scripted) shows a scripted request; ``notice`` (random weights) is said first."""
    auth = " -H \"Authorization: Bearer $SGLANG_OMNI_API_KEY\"" if keyed else ""
    template = TRY_SCRIPTED_UMM if scripted and mode == "umm" else TRY.get(mode, TRY["umm"])
    curl = template.format(url=url, auth=auth)
    said = f" ({notice})" if notice else ""
    return f"sgl-omni: ready in {seconds:.1f} s{said}: open {url}/ (the playground), or try: {curl}"


def _scripted_reasoner(config: ResolvedConfig) -> bool:
    reasoner = config.stages.get("reasoner")
    return reasoner is not None and reasoner.factory.get("backend") == "scripted"


def run_server(config: ResolvedConfig, sock: socket.socket, *, host: str, port: int,
               model_name: str | None, log_level: str, log_format: str,
               log_polls: bool = False) -> int:
    """Serve until stopped; the exit code (0, :data:`STOPPED`, :data:`STARTUP_FAILED`, or 2 for
    a configuration error the app found).

    The stage processes are spawned first, before the server imports its app (FastAPI and the
    routes): their imports and model loads overlap the server's own start."""
    import uvicorn
    from uvicorn._compat import asyncio_run

    from sglang_omni.errors import ConfigError
    from sglang_omni.pipeline.orchestrator import Orchestrator
    from sglang_omni.pipeline.process_setup import bound_large_allocations

    configure_logging(log_level, log_format)
    bound_large_allocations()  # before the stages start: they inherit it
    started = time.monotonic()
    try:
        orchestrator = Orchestrator(config, log_level, log_format)
    except ConfigError as exc:
        print(f"sgl-omni: configuration error: {exc}", file=sys.stderr)
        return 2
    holder: dict[str, Any] = {}

    async def serve() -> None:
        if slow_s is not None:  # a development aid (runtime.loop_watch)
            loop_watch.watch(asyncio.get_running_loop(), slow_s)
        # SIGINT and SIGTERM stop the start from before the stages spawn: until the app is built
        # (the build is synchronous) they are noted, and the stages are stopped and nothing is
        # served; once it is, they go to uvicorn's server, which takes them itself as it begins.
        stop_signals: list[int] = []

        def on_stop_signal(signum: int, frame: Any) -> None:
            built = holder.get("server")
            if built is None:
                stop_signals.append(signum)
            else:
                built.handle_exit(signum, frame)

        previous = {sig: signal.signal(sig, on_stop_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            orchestrator.stages.spawn()
            try:
                server = _build_server(config, orchestrator, holder, started, host=host,
                                       port=port, model_name=model_name, log_level=log_level,
                                       log_format=log_format, log_polls=log_polls)
            except BaseException:  # a configuration error: the stages go too
                await orchestrator.stop()
                raise
            if stop_signals:
                log.info("stopping: %s arrived while the server was starting",
                         signal.Signals(stop_signals[0]).name)
                await orchestrator.stop()
                holder["stopped_starting"] = True
                return
            await server.serve(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # uvicorn's own choice of event loop (``Server.run`` runs ``serve`` the same way); its
    # app is only read when the server loads it.
    # (log_config None: a Config configures logging as it is made, which would undo
    # configure_logging's JSON lines)
    # (the standard library's under SGLANG_OMNI_SLOW_CALLBACK_S: runtime.loop_watch times it)
    slow_s = loop_watch.slow_callback_s()
    loop_factory = uvicorn.Config("sglang_omni.serve.app:unused", log_config=None,
                                  loop="auto" if slow_s is None else "asyncio"
                                  ).get_loop_factory()
    try:
        with contextlib.closing(sock):
            asyncio_run(serve(), loop_factory=loop_factory)
    except ConfigError as exc:
        print(f"sgl-omni: configuration error: {exc}", file=sys.stderr)
        return 2
    server = holder["server"]
    if orchestrator.fatal_error is not None:
        print(f"sgl-omni: stopped: {orchestrator.fatal_error}", file=sys.stderr)
        return STOPPED
    if holder.get("stopped_starting"):
        return 0
    if not server.started or holder["app"].state.startup_error is not None:
        return STARTUP_FAILED
    return 0


def _build_server(config: ResolvedConfig, orchestrator: Any, holder: dict[str, Any],
                  started: float, *, host: str, port: int, model_name: str | None,
                  log_level: str, log_format: str, log_polls: bool) -> Any:
    """The app around ``orchestrator`` and the uvicorn server that serves it (also put in
    ``holder`` as ``app`` and ``server``); ConfigError when the app finds the configuration
    wrong. ``started``: monotonic time the ready line counts from."""
    import uvicorn

    from sglang_omni.serve.app import create_app
    from sglang_omni.serve.ops.request_log import quiet_polls
    from sglang_omni.serve.ops.shutdown import DrainingServer, uvicorn_timeout
    from sglang_omni.serve.protocol.connection import uvicorn_options
    from sglang_omni.serve.protocol.head_limit import HeadLimit

    if not log_polls:
        quiet_polls()
    url = display_url(host, port)

    async def on_ready() -> None:
        server = holder["server"]
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.01)
        if server.should_exit:
            return
        random = app.state.random_weights
        line = ready_line(orchestrator.mode, url, config.server.api_key is not None,
                          time.monotonic() - started, scripted=_scripted_reasoner(config),
                          notice=random.notice_for(makes_media=orchestrator.mode != "chat")
                          if random is not None else None)
        if log_format == "json":  # a log collector reads JSON lines only
            log.info(line.removeprefix("sgl-omni: "),
                     extra={"omni_fields": {"event": "ready", "playground": f"{url}/"}})
        else:
            print(line, file=sys.stderr, flush=True)

    def on_failure() -> None:
        holder["server"].should_exit = True

    app = create_app(config, model_name, log_level, log_format=log_format,
                     background_start=True, on_ready=on_ready, on_startup_failure=on_failure,
                     log_polls=log_polls, prepared=orchestrator)
    json_logs = log_format == "json"
    grace_s = config.server.shutdown_grace_s
    server = DrainingServer(uvicorn.Config(
        HeadLimit(app), host=host, port=port, log_level=log_level,
        timeout_graceful_shutdown=uvicorn_timeout(grace_s),
        log_config=None if json_logs else uvicorn.config.LOGGING_CONFIG,
        access_log=not json_logs,
        **uvicorn_options(config.server, app.state.body_budget)), orchestrator, grace_s)
    holder["app"], holder["server"] = app, server
    orchestrator.on_fatal = lambda: setattr(server, "should_exit", True)
    return server
