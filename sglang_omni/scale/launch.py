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
from sglang_omni.scale.ray_auth import check_token_auth
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
    check_token_auth(ray_address)
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


def poll_replicas(app_name: str = "omni", timeout_s: float = 10.0
                  ) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Ask every replica actor of ``app_name`` for its routing stats (``record_routing_stats``,
    the method Ray's controller polls; this process must be connected to the cluster).

    Returns the answers sorted by replica id, and ``{replica id: why}`` for each replica that
    did not answer within ``timeout_s`` or could not be reached. A replica whose server is
    still starting (its stages loading: Ray answers its stats call with an error until its
    constructor returned) is listed with ``health: starting`` (:func:`starting_stats`)."""
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
    answers, silent = [], {}
    deadline = time.monotonic() + timeout_s
    for name, ref in refs.items():
        replica = name.rsplit("#", 1)[-1]
        try:
            answers.append(ray.get(ref, timeout=max(0.1, deadline - time.monotonic())))
        except ray.exceptions.GetTimeoutError:
            silent[replica] = f"no answer in {timeout_s:g} s"
        except ray.exceptions.RayError as exc:
            if isinstance(exc, ray.exceptions.RayTaskError) and _starting(name, deadline):
                answers.append(starting_stats(replica))
            else:
                silent[replica] = f"unreachable ({type(exc).__name__})"
    return sorted(answers, key=lambda s: s.get("replica", "")), silent


def starting_stats(replica: str) -> dict[str, Any]:
    """The routing stats listed for a replica whose server is still starting."""
    return {"at": time.time(), "replica": replica, "health": "starting"}


def _starting(name: str, deadline: float) -> bool:
    """Whether replica actor ``name`` is alive but its server (the deployment's constructor,
    which starts the stages) has not finished starting (Ray's ``was_initialized``)."""
    try:
        actor = ray.get_actor(name, namespace=SERVE_NAMESPACE)
        return ray.get(actor.was_initialized.remote(),
                       timeout=max(0.1, deadline - time.monotonic())) is False
    except (ValueError, ray.exceptions.RayError):
        return False


def replica_stats(app_name: str = "omni", timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The routing stats of every replica of ``app_name`` that answers (see poll_replicas)."""
    return poll_replicas(app_name, timeout_s)[0]


def format_stats(stats: dict[str, Any]) -> str:
    """One line of ``sgl-omni replicas``."""
    if stats.get("health") == "starting" and "pid" not in stats:
        return f"{stats.get('replica')} starting: its server is starting its stages"
    quote = stats.get("quote") or {}
    gen = (stats.get("stages", {}).get("generation") or {}).get("jobs", {})
    answers = stats.get("answers", {})
    plan = (f"stage free in {quote['stage_free_in_s']:.1f} s, admits "
            f"{'no' if quote['refused'] else quote['allowance']} generation(s)") if quote else "-"
    return (f"{stats.get('replica')} pid {stats.get('pid')} {stats.get('health')}: "
            f"in flight {stats.get('in_flight')}, answered 2xx {answers.get('2xx', 0)} "
            f"503 {answers.get('503', 0)} other {answers.get('4xx', 0) + answers.get('5xx', 0)}, "
            f"generations {gen.get('completed', 0)}; {plan}")


#: Seconds ``sgl-omni replicas`` waits for the replicas' answers (``--timeout-s``).
REPLICAS_TIMEOUT_S = 2.0


def print_replicas(ray_address: str, app_name: str,
                   timeout_s: float = REPLICAS_TIMEOUT_S) -> int:
    """Print one line a replica (those that did not answer within ``timeout_s`` named as
    such); exit 1 when there is none or one did not answer."""
    check_token_auth(ray_address)
    ray.init(address=ray_address, namespace=SERVE_NAMESPACE, logging_level=logging.WARNING)
    try:
        answers, silent = poll_replicas(app_name, timeout_s)
    finally:
        ray.shutdown()
    if not answers and not silent:
        print(f"sgl-omni: no running replica of application {app_name!r}", file=sys.stderr)
        return 1
    for s in answers:
        print(format_stats(s))
    for replica, why in sorted(silent.items()):
        print(f"{replica} {why}")
    return 1 if silent else 0
