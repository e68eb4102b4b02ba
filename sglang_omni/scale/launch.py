"""``sgl-omni serve --ray``: start or join a Ray cluster, run the application, wait, clean up;
and ``sgl-omni replicas``: each replica's routing stats, read from its actor.

Without ``--ray-address`` a local Ray instance is started (and stopped on exit); with one
(``auto``, ``HOST:6379`` or ``ray://...``) the cluster is joined and the application is deleted
from it on exit. Ray's HTTP proxy listens on ``--host``/``--port`` of every node.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Any

import ray
from ray import serve

from sglang_omni.config.server import ServerSettings
from sglang_omni.scale.builder import application
from sglang_omni.scale.spec import ScaleOptions, ServerSource, plan_replicas

REPLICA_ACTOR_PREFIX = "SERVE_REPLICA::"
SERVE_NAMESPACE = "serve"


def http_options(host: str, port: int, server: ServerSettings) -> dict[str, Any]:
    """Ray's proxy options: our address, and our idle timeout for keep-alive connections."""
    return {"host": host, "port": port,
            "keep_alive_timeout_s": max(1, int(server.idle_timeout_s))}


def serve_on_ray(source: ServerSource, options: ScaleOptions, host: str, port: int,
                 ray_address: str | None) -> int:
    """Run the application until SIGINT/SIGTERM; ConfigError before Ray is touched."""
    plan, config = plan_replicas(source)
    app = application(plan, config, options)
    ray.init(address=ray_address, namespace=SERVE_NAMESPACE, log_to_driver=True)
    started_here = ray_address is None
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options=http_options(host, port, config.server))
        serve.run(app, name=options.app_name, route_prefix="/", blocking=False)
        print(f"sgl-omni: {options.replicas} replica(s) of {config.config_cls} ready at "
              f"http://{host}:{port} (router {options.router}, {plan.gpus} GPU(s) a replica); "
              "`sgl-omni replicas` lists them", file=sys.stderr, flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("sgl-omni: stopping the application", file=sys.stderr, flush=True)
        try:
            serve.delete(options.app_name)
            if started_here:
                serve.shutdown()
        finally:
            ray.shutdown()
    return 0


def replica_stats(app_name: str = "omni", timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The routing stats of every running replica of ``app_name`` (this process must be
    connected to the cluster), by asking each replica actor (``record_routing_stats``, the
    method Ray's controller polls)."""
    prefix = f"{REPLICA_ACTOR_PREFIX}{app_name}#OmniReplica#"
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["name"].startswith(prefix)]
    refs: dict[str, ray.ObjectRef] = {}
    for name in names:
        try:
            refs[name] = ray.get_actor(name, namespace=SERVE_NAMESPACE).record_routing_stats \
                .remote()
        except ValueError:  # gone meanwhile
            continue
    out = []
    deadline = time.monotonic() + timeout_s
    for ref in refs.values():
        try:
            out.append(ray.get(ref, timeout=max(0.1, deadline - time.monotonic())))
        except (ray.exceptions.RayError, TimeoutError):
            continue
    return sorted(out, key=lambda s: s.get("replica", ""))


def format_stats(stats: dict[str, Any]) -> str:
    """One line of ``sgl-omni replicas``."""
    quote = stats.get("quote") or {}
    gen = (stats.get("stages", {}).get("generation") or {}).get("jobs", {})
    answers = stats.get("answers", {})
    plan = (f"stage free in {quote['stage_free_in_s']:.1f} s, admits "
            f"{'no' if quote['refused'] else quote['allowance']} generation(s)") if quote else "-"
    return (f"{stats.get('replica')} pid {stats.get('pid')} {stats.get('health')}: "
            f"in flight {stats.get('in_flight')}, answered 2xx {answers.get('2xx', 0)} "
            f"503 {answers.get('503', 0)} other {answers.get('4xx', 0) + answers.get('5xx', 0)}, "
            f"generations {gen.get('completed', 0)}; {plan}")


def print_replicas(ray_address: str, app_name: str) -> int:
    ray.init(address=ray_address, namespace=SERVE_NAMESPACE, logging_level=logging.WARNING)
    try:
        stats = replica_stats(app_name)
    finally:
        ray.shutdown()
    if not stats:
        print(f"sgl-omni: no running replica of application {app_name!r}", file=sys.stderr)
        return 1
    for s in stats:
        print(format_stats(s))
    return 0
