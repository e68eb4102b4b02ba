"""The Ray Serve application of one Omni pipeline config: replicas of the whole server behind a
gateway, and the application builder for Serve config files (``serve run`` / ``serve deploy`` /
KubeRay ``RayService``).

A Serve config file names the builder and its arguments::

    applications:
      - name: omni
        route_prefix: /
        import_path: sglang_omni.scale.builder:app_builder
        args:
          config: /models/cosmos3.yaml      # read where the application is built
          replicas: 4
          router: deadline                  # or pow2, round_robin
          overrides: {generation.factory.output_dir: /outputs}

``serve run sglang_omni.scale.builder:app_builder config=cosmos3.yaml replicas=2
generation.factory.step_time_s=0.1`` takes the same keys (a key with a dot is an override).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application

from sglang_omni.config import ResolvedConfig, parse_overrides
from sglang_omni.errors import ConfigError
from sglang_omni.runtime.log_format import LOG_FORMATS, LOG_LEVELS
from sglang_omni.scale.gateway import OmniGateway
from sglang_omni.scale.replica import OmniReplica
from sglang_omni.scale.spec import (
    LOAD_OPTIONS,
    ROUTERS,
    ReplicaPlan,
    ScaleOptions,
    ServerSource,
    plan_replicas,
)

#: Requests Ray lets a replica or gateway hold at once; Omni's own admission (max_active, the
#: planner) decides what a replica takes, so Ray's cap is only a backstop.
MAX_ONGOING = 1024
#: Seconds a replica's stats may take before Ray treats the poll as failed.
STATS_TIMEOUT_S = 10.0
#: Replica constructor attempts (a stage that cannot start fails them all).
CONSTRUCTOR_RETRIES = 3
GRACEFUL_SHUTDOWN_S = 30.0

Gateway = serve.ingress()(OmniGateway)


def application(plan: ReplicaPlan, config: ResolvedConfig, options: ScaleOptions
                ) -> Application:
    """The Serve application: ``options.replicas`` OmniReplica behind OmniGateway."""
    replica = serve.deployment(
        name="OmniReplica", num_replicas=options.replicas,
        ray_actor_options={"num_gpus": plan.gpus, "num_cpus": options.replica_cpus},
        max_ongoing_requests=MAX_ONGOING,
        request_router_config={
            "request_router_class": ROUTERS[options.router],
            "request_router_kwargs": router_kwargs(options),
            "request_routing_stats_period_s": options.stats_period_s,
            "request_routing_stats_timeout_s": STATS_TIMEOUT_S},
        health_check_period_s=options.health_check_period_s,
        health_check_timeout_s=options.health_check_timeout_s,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
        max_constructor_retry_count=CONSTRUCTOR_RETRIES,
    )(OmniReplica).bind(plan)
    return serve.deployment(
        name="OmniGateway", num_replicas=options.gateways,
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING,
    )(Gateway).bind(replica, config.server, options.retry_limit, options.replicas,
                    options.waiting_places, options.replica_silence_s, options.fleet_read_s)


def router_kwargs(options: ScaleOptions) -> dict[str, Any]:
    """The router's ``initialize_state`` keywords (only ours take any)."""
    return {"max_wait_s": options.max_wait_s} if options.router == "deadline" else {}


def build(source: ServerSource, options: ScaleOptions) -> Application:
    """Check ``source`` here (ConfigError) and build its application."""
    plan, config = plan_replicas(source)
    return application(plan, config, options)


OPTION_KEYS = {"replicas": int, "router": str, "retries": int, "gateways": int,
               "max_wait_s": float, "max_waiting": int,
               "stats_period_s": float, "replica_cpus": float, "health_check_period_s": float,
               "health_check_timeout_s": float, "replica_silence_s": float,
               "fleet_read_s": float}


def app_builder(args: Mapping[str, Any]) -> Application:
    """Serve's application builder (``import_path: sglang_omni.scale.builder:app_builder``).

    Keys: ``config`` (the pipeline YAML), the :class:`ScaleOptions` fields (``replicas``,
    ``router``, ``retries``, ``gateways``, ...), ``model_name``, ``log_level``, ``log_format``,
    the CLI's config flags (``model_path``, ``text_only``, ``allowed_local_media_path``,
    ``allowed_media_domain``, ``api_key``) and ``overrides`` (a mapping of dotted keys, as the
    CLI's ``--a.b value``); any other key with a dot is an override too. Values may be strings
    (``serve run k=v``).
    """
    args = dict(args)
    overrides: dict[str, Any] = {}
    for key, value in dict(args.pop("overrides", None) or {}).items():
        overrides.update(_override(key, value))
    for key in [k for k in args if "." in k]:
        overrides.update(_override(key, args.pop(key)))
    options = {k: OPTION_KEYS[k](args.pop(k)) for k in list(args) if k in OPTION_KEYS}
    load = {k: args.pop(k) for k in LOAD_OPTIONS if k in args}
    if isinstance(load.get("text_only"), str):
        load["text_only"] = load["text_only"].lower() in ("1", "true", "yes")
    if isinstance(load.get("allowed_media_domain"), str):
        load["allowed_media_domain"] = [load["allowed_media_domain"]]
    config = args.pop("config", None)
    model_name = args.pop("model_name", None)
    log_level = str(args.pop("log_level", "info")).lower()
    log_format = str(args.pop("log_format", "text"))
    if log_level not in LOG_LEVELS:
        raise ConfigError(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got "
                          f"{log_level!r}")
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format: expected one of {', '.join(LOG_FORMATS)}, got "
                          f"{log_format!r}")
    if args:
        raise ConfigError(f"unknown application argument(s): {', '.join(sorted(args))}")
    source = ServerSource.from_file(config, overrides, model_name=model_name,
                                    log_level=log_level, log_format=log_format, **load)
    return build(source, ScaleOptions(**options))


def _override(key: str, value: Any) -> dict[str, Any]:
    """One dotted override; a string value is read as the CLI reads it (YAML scalars)."""
    if isinstance(value, str):
        return parse_overrides([f"--{key}", value])
    return {key: value}
