"""What a Ray Serve deployment of Omni is made of: the server config each replica resolves, and
the fleet's shape (replicas, router, retries), checked on the machine that builds it.

Replicas resolve the config themselves (:meth:`ServerSource.resolve`), where Ray placed them:
the driver's files are not on the other nodes, so the config file travels as text, and the GPU
indices of ``stages.<name>.gpu`` become indices into the GPUs Ray gave the replica (Ray sets
``CUDA_VISIBLE_DEVICES``). A replica asks Ray for one GPU per distinct index its stages use: the
default Cosmos3 placement (generation 0, Reasoner 1) takes two, both stages on GPU 0 one, every
stage on the CPU (``gpu: null``) none. Model paths and media folders must exist on every node.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_omni.config import ResolvedConfig, load_config, parse_overrides
from sglang_omni.errors import ConfigError

#: ``load_config`` keyword arguments a source may carry (the CLI's flags).
LOAD_OPTIONS = ("model_path", "text_only", "allowed_local_media_path", "allowed_media_domain",
                "api_key")
#: GPUs assumed visible while the driver checks a config (placement is checked on the replica).
ANY_GPUS = 1 << 16
#: ``--router`` choices and the router classes they name (in :mod:`~sglang_omni.scale.routers`).
ROUTERS: dict[str, str] = {
    "deadline": "sglang_omni.scale.routers:DeadlineRouter",
    "pow2": "sglang_omni.scale.routers:PowerOfTwoRouter",
    "round_robin": "sglang_omni.scale.routers:RoundRobinRouter",
}
ROUTER_CHOICES = tuple(ROUTERS)


@dataclass(frozen=True)
class ServerSource:
    """One Omni server's configuration as the CLI gave it: the config file's text, dotted
    overrides, the ``load_config`` options, and the served model name, log level and log
    format (``text`` or ``json``, as ``--log-format``)."""

    config_text: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    model_name: str | None = None
    log_level: str = "info"
    log_format: str = "text"

    @classmethod
    def from_file(cls, config: str | Path | None, overrides: dict[str, Any] | None = None,
                  **kwargs: Any) -> ServerSource:
        """Read ``config`` (a path on this machine) now; ConfigError if it cannot be read."""
        text = None
        if config is not None:
            try:
                text = Path(config).read_text()
            except OSError as exc:
                raise ConfigError(f"--config {config}: cannot read the file "
                                  f"({exc.strerror})") from None
        options = {k: kwargs.pop(k) for k in LOAD_OPTIONS if k in kwargs}
        return cls(text, dict(overrides or {}), options, **kwargs)

    def resolve(self, visible_gpus: int | None = None,
                extra: dict[str, Any] | None = None) -> ResolvedConfig:
        """``load_config`` of this source (``extra`` overrides win); ConfigError as it raises."""
        overrides = {**self.overrides, **(extra or {})}
        if self.config_text is None:
            return load_config(None, overrides, visible_gpus=visible_gpus, **self.options)
        fd, path = tempfile.mkstemp(prefix="sgl-omni-", suffix=".yaml")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.config_text)
            return load_config(path, overrides, visible_gpus=visible_gpus, **self.options)
        finally:
            os.unlink(path)


@dataclass(frozen=True)
class ScaleOptions:
    """The fleet: ``replicas`` whole servers behind ``gateways`` gateway replicas; ``router``
    picks the replica (``deadline``, ``pow2`` or ``round_robin``); a 503 is retried on another
    replica up to ``retries`` times (None: one less than the replicas, at most 3); with the
    ``deadline`` router a planned request no replica admits now waits at the gateway up to
    ``max_wait_s`` for one that will (0: refused at once), at most ``max_waiting`` requests at
    once on each gateway (beyond them a request is refused at once when no replica admits it).
    Ray checks each replica every ``health_check_period_s``; one that raises (its server cannot
    recover) or does not answer within ``health_check_timeout_s`` three times in a row (a frozen
    process, a blocked event loop) is replaced; long before, a gateway fails a request whose
    replica's call brought nothing (not even its keep-alive) for ``replica_silence_s`` and
    passes that replica over. A fleet read (``GET /metrics``, ``GET /v1/videos``,
    ``GET /v1/queue``) answers within ``fleet_read_s`` of reaching the gateway, the replicas'
    answers waited for and merged, and names the replicas that did not answer in time."""

    replicas: int = 2
    router: str = "deadline"
    retries: int | None = None
    max_wait_s: float = 30.0
    max_waiting: int = 256
    gateways: int = 1
    stats_period_s: float = 0.5
    replica_cpus: float = 1.0
    health_check_period_s: float = 2.0
    health_check_timeout_s: float = 10.0
    replica_silence_s: float = 6.0
    fleet_read_s: float = 1.2
    app_name: str = "omni"

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"--replicas: expected at least 1, got {self.replicas}")
        if self.gateways < 1:
            raise ConfigError(f"--gateways: expected at least 1, got {self.gateways}")
        if self.router not in ROUTER_CHOICES:
            raise ConfigError(f"--router: expected one of {', '.join(ROUTER_CHOICES)}, got "
                              f"{self.router!r}")
        if self.retries is not None and self.retries < 0:
            raise ConfigError(f"--retries: expected 0 or more, got {self.retries}")
        if not (self.max_wait_s >= 0 and math.isfinite(self.max_wait_s)):
            raise ConfigError(f"--max-wait-s: expected a number of seconds >= 0, got "
                              f"{self.max_wait_s}")
        if self.max_waiting < 0:
            raise ConfigError(f"--max-waiting: expected 0 or more, got {self.max_waiting}")
        for name in ("health_check_period_s", "health_check_timeout_s", "replica_silence_s",
                     "fleet_read_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name}: expected a positive number of seconds, got {value}")
        if not self.stats_period_s > 0:
            raise ConfigError(f"stats_period_s: expected a positive number, got "
                              f"{self.stats_period_s}")

    @property
    def retry_limit(self) -> int:
        if self.retries is not None:
            return self.retries
        return min(3, self.replicas - 1)

    @property
    def waiting_places(self) -> int:
        """Places in each gateway's waiting room: ``max_waiting`` where a request may wait
        (the ``deadline`` router with ``max_wait_s`` above 0), else none (no request waits, so
        none is counted as waiting while it travels to the replica that refuses it)."""
        return self.max_waiting if self.router == "deadline" and self.max_wait_s > 0 else 0


@dataclass(frozen=True)
class ReplicaPlan:
    """What each replica runs: the source, the GPU remapping, and the resources it asks for."""

    source: ServerSource
    gpus: int
    gpu_overrides: dict[str, int]

    def resolve(self) -> ResolvedConfig:
        """The config on the replica, stages placed on the GPUs Ray gave it."""
        return self.source.resolve(extra=dict(self.gpu_overrides))


def plan_replicas(source: ServerSource) -> tuple[ReplicaPlan, ResolvedConfig]:
    """Check ``source`` here (ConfigError names the key) and plan the replicas' GPUs."""
    config = source.resolve(visible_gpus=ANY_GPUS)
    used = sorted({s.gpu for s in config.process_stages() if s.gpu is not None})
    remap = {f"stages.{s.name}.gpu": used.index(s.gpu)
             for s in config.process_stages() if s.gpu is not None}
    return ReplicaPlan(source, len(used), remap), config


def from_cli(args: argparse.Namespace, extra: list[str]) -> tuple[ServerSource, ScaleOptions]:
    """The server source and fleet options of ``sgl-omni serve --ray`` flags."""
    overrides = parse_overrides(extra)
    if args.mem_fraction_static is not None:
        overrides["reasoner.engine.mem_fraction_static"] = args.mem_fraction_static
    source = ServerSource.from_file(
        args.config, overrides, model_name=args.model_name, log_level=args.log_level,
        log_format=args.log_format,
        model_path=args.model_path, text_only=args.text_only,
        allowed_local_media_path=args.allowed_local_media_path,
        allowed_media_domain=args.allowed_media_domain, api_key=args.api_key)
    options = ScaleOptions(replicas=args.replicas, router=args.router, retries=args.retries,
                           gateways=args.gateways, max_wait_s=args.max_wait_s,
                           max_waiting=args.max_waiting)
    return source, options
