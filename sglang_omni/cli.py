"""``sgl-omni``: serve a pipeline, or print its resolved configuration.

Imports stay light (no FastAPI, torch or sglang) until a command needs them, so ``--help`` works
on a bare machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from sglang_omni.errors import ConfigError
from sglang_omni.runtime.log_format import LOG_FORMATS, LOG_LEVELS
from sglang_omni.scale.spec import ROUTER_CHOICES

#: The model id ``--demo`` serves under unless ``--model-name`` names another (the checkpoint's
#: path is a cache folder no client would guess).
DEMO_MODEL_NAME = "cosmos3"
EPILOG = """overrides: any stage field as a dotted flag, the stages. prefix left out, e.g.
  --reasoner.gpu 3  --generation.factory.output_dir out  --reasoner.engine.context_length 32768
  --generation.factory.backend scripted  --orchestrator.factory.timeout_s 600
  server settings (limits, timeouts) the same way: --server.max_body_bytes 1048576
Flags outrank the config file."""


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="pipeline config YAML (config_cls, model_path, stages)")
    p.add_argument("--model-path", help="checkpoint folder (overrides model_path)")
    p.add_argument("--text-only", action="store_true",
                   help="serve the Cosmos3 Reasoner alone as an OpenAI chat service")
    p.add_argument("--allowed-local-media-path", metavar="DIR",
                   help="folder that file:// URLs and local media paths must resolve into")
    p.add_argument("--allowed-media-domain", metavar="HOST", action="append",
                   help="fetch remote media only from this host (repeatable)")
    p.add_argument("--api-key", metavar="KEY", help=(
        "require 'Authorization: Bearer KEY' on every route but /health, the API docs and "
        "the playground page (or set "
        "SGLANG_OMNI_API_KEY, which keeps the key out of process listings)"))
    p.add_argument("--mem-fraction-static", type=float, metavar="F",
                   help="native SGLang memory fraction of the Reasoner (same as "
                        "--reasoner.engine.mem_fraction_static); wins over "
                        "stages.reasoner.gpu_memory_fraction")


def _ray_args(p: argparse.ArgumentParser) -> None:
    ray = p.add_argument_group("scale out on Ray Serve (needs the ray extra)")
    ray.add_argument("--ray", action="store_true", help=(
        "serve --replicas whole servers behind one endpoint on Ray Serve; each replica asks Ray "
        "for the GPUs its stages use (--host/--port are Ray's HTTP proxy's)"))
    ray.add_argument("--replicas", type=int, default=2, metavar="N", help="replicas (default 2)")
    ray.add_argument("--ray-address", metavar="ADDR", help=(
        "join this Ray cluster (auto, HOST:6379, ray://HOST:10001); default: start a local one"))
    ray.add_argument("--router", default="deadline", choices=ROUTER_CHOICES,
                     help="replica choice: the earliest deadline plan (default), Ray's "
                          "power-of-two choices, or round robin")
    ray.add_argument("--retries", type=int, metavar="N", help=(
        "retry a 503 on another replica up to N times (default: replicas - 1, at most 3)"))
    ray.add_argument("--gateways", type=int, default=1, metavar="N",
                     help="gateway replicas in front of the replicas (default 1)")
    ray.add_argument("--max-wait-s", type=float, default=30.0, metavar="S", help=(
        "deadline router: an interleaved request no replica's plan admits now waits at the "
        "gateway up to S seconds for one that will, its deadline counted from its arrival "
        "(default 30; 0 answers 503 at once)"))
    ray.add_argument("--max-waiting", type=int, default=256, metavar="N", help=(
        "deadline router: at most N requests wait at each gateway at once; beyond them a request "
        "no replica admits now is answered 503 at once (default 256)"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgl-omni", description=(
        "SGLang Omni: serve unified multimodal models (NVIDIA Cosmos3 Nano) on native SGLang."))
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the HTTP server", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: %(default)s; 0.0.0.0 for every "
                            "interface)")
    serve.add_argument("--port", type=int, default=8000,
                       help="port to listen on (default: %(default)s); checked before anything "
                            "loads")
    serve.add_argument("--model-name", help=(
        f"model id reported by /v1/models (default: the checkpoint path; with --demo, "
        f"{DEMO_MODEL_NAME}); requests naming another get 404"))
    serve.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    serve.add_argument("--log-format", default="text", choices=LOG_FORMATS,
                       help="log lines of the server and its stages as text (default) or one "
                            "JSON object per line, one line per request included")
    serve.add_argument("--log-polls", action="store_true", help=(
        "log polls of /health, /v1/queue, /metrics and static assets too (by default they are "
        "counted in the metrics but kept out of the request log and uvicorn's access log)"))
    serve.add_argument("--demo", action="store_true", help=(
        "serve the interleaved pipeline on the CPU with the hf backend and a tiny random-weight "
        "Cosmos3 checkpoint (built once into ~/.cache/sglang-omni; needs the hf extra); with "
        "--text-only the Reasoner alone as a chat service"))
    serve.add_argument("--direct", action="store_true", help=(
        "with --demo: serve direct generation (Cosmos3PipelineConfig: the native image, video "
        "and action routes) instead of the interleaved pipeline"))
    _ray_args(serve)
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    resolve = config_sub.add_parser("resolve", help="print the merged configuration",
                                    epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(resolve)
    replicas = sub.add_parser("replicas", help=(
        "list the replicas of a running `serve --ray` application with their routing stats "
        "(needs the ray extra)"))
    replicas.add_argument("--ray-address", default="auto",
                          help="the Ray cluster (default: the one running on this machine)")
    replicas.add_argument("--app", default="omni", help="the Serve application name")
    replicas.add_argument("--timeout-s", type=float, default=2.0, metavar="S", help=(
        "wait at most S seconds for the replicas' answers; those that did not answer are "
        "listed as such (default 2)"))
    tiny = sub.add_parser("make-tiny-checkpoint", help=(
        "build the tiny seeded random-weight Cosmos3 checkpoint (needs the hf extra)"))
    tiny.add_argument("dir", help="folder to create")
    tiny.add_argument("--seed", type=int, default=0)
    _make_checkpoint_args(sub)
    return parser


def _make_checkpoint_args(sub: Any) -> None:
    made = sub.add_parser("make-checkpoint", help=(
        "build a seeded random-weight Cosmos3 checkpoint in the real layout: --shape nano is "
        "Cosmos3 Nano's size (about 33 GB, sharded bf16; needs the hf extra and a GPU to be "
        "quick)"))
    made.add_argument("dir", help="folder to create")
    made.add_argument("--shape", default="nano", choices=["nano", "micro", "tiny"])
    made.add_argument("--seed", type=int, default=0)
    made.add_argument("--device", help="where to initialise the weights (default: the GPU if "
                                       "there is one)")


def _make_checkpoint(args: argparse.Namespace) -> int:
    from sglang_omni.models.cosmos3.nano_checkpoint import build_checkpoint

    try:
        path = build_checkpoint(args.dir, shape=args.shape, seed=args.seed, device=args.device,
                                log=lambda line: print(f"sgl-omni: {line}", file=sys.stderr,
                                                       flush=True))
    except FileExistsError as exc:
        print(f"sgl-omni: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _resolve(args: argparse.Namespace, extra: list[str],
             before_loading: Callable[[], None] = lambda: None) -> Any:
    """The configuration; ``before_loading()`` runs before the demo checkpoint is built."""
    from sglang_omni.config import load_config, parse_overrides

    overrides = parse_overrides(extra)
    model_path = args.model_path
    if getattr(args, "direct", False) and not args.demo:
        raise ConfigError("--direct goes with --demo; otherwise set config_cls: "
                          "Cosmos3PipelineConfig in the config file")
    if getattr(args, "demo", False):
        from sglang_omni.models.cosmos3 import tiny_checkpoint

        if args.config:
            raise ConfigError("--demo brings its own configuration; drop --config (flags such "
                              "as --port or --generation.engine.defaults still apply)")
        demo = tiny_checkpoint.DEMO_OVERRIDES
        if getattr(args, "direct", False) and args.text_only:
            raise ConfigError("--direct and --text-only: choose one (direct generation, or the "
                              "Reasoner alone)")
        if getattr(args, "direct", False):  # the generation stage alone
            demo = {"config_cls": "Cosmos3PipelineConfig",
                    **{k: v for k, v in demo.items() if k.startswith("generation.")}}
        elif args.text_only:  # the Reasoner alone (--text-only selects its config class)
            demo = {k: v for k, v in demo.items()
                    if k.startswith("reasoner.") and "max_structured_tokens" not in k}
        overrides = {**demo, **overrides}
        if model_path is None:
            before_loading()
            model_path = str(tiny_checkpoint.cached_tiny_checkpoint(
                log=lambda line: print(f"sgl-omni: {line}", file=sys.stderr, flush=True)))
    if args.mem_fraction_static is not None:
        overrides["reasoner.engine.mem_fraction_static"] = args.mem_fraction_static
    return load_config(
        args.config, overrides, model_path=model_path,
        text_only=args.text_only, allowed_local_media_path=args.allowed_local_media_path,
        allowed_media_domain=args.allowed_media_domain, api_key=args.api_key,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "make-tiny-checkpoint":
        from sglang_omni.models.cosmos3.tiny_checkpoint import build_tiny_checkpoint

        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            print(build_tiny_checkpoint(args.dir, seed=args.seed))
        except FileExistsError as exc:
            print(f"sgl-omni: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "make-checkpoint":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return _make_checkpoint(args)
    if args.command == "replicas" or (args.command == "serve" and args.ray):
        return _on_ray(parser, args, extra)
    from sglang_omni.serve.ops.startup import PortInUse, listen_socket  # light: no FastAPI

    sock: Any = None

    def claim_port() -> None:  # before anything loads: a port in use fails at once
        nonlocal sock
        if args.command == "serve" and sock is None:
            sock = listen_socket(args.host, args.port)

    try:
        config = _resolve(args, extra, before_loading=claim_port)
        claim_port()
    except (ConfigError, PortInUse) as exc:
        if sock is not None:
            sock.close()
        what = "configuration error: " if isinstance(exc, ConfigError) else ""
        print(f"sgl-omni: {what}{exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    return _serve(config, args, sock)


def _on_ray(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """``serve --ray`` and ``replicas``: the config is resolved on each replica (its GPUs)."""
    import importlib.util

    from sglang_omni.scale import spec

    if args.command == "replicas" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "serve":
            if args.demo:
                raise ConfigError("--demo and --ray: run the demo on one server, or give "
                                  "--config")
            source, options = spec.from_cli(args, extra)
            spec.plan_replicas(source)  # configuration errors before Ray is imported
    except ConfigError as exc:
        print(f"sgl-omni: configuration error: {exc}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("ray") is None:
        print("sgl-omni: this needs the ray extra: pip install 'sglang-omni[ray]'",
              file=sys.stderr)
        return 2
    from sglang_omni.scale import launch
    from sglang_omni.scale.ray_auth import RayAuthRequired

    try:
        if args.command == "replicas":
            return launch.print_replicas(args.ray_address, args.app, args.timeout_s)
        return launch.serve_on_ray(source, options, args.host, args.port, args.ray_address)
    except RayAuthRequired as exc:
        print(f"sgl-omni: {exc}", file=sys.stderr)
        return 2


def _serve(config: Any, args: argparse.Namespace, sock: Any) -> int:
    """Serve on ``sock`` (bound before the configuration was resolved); see serve.startup."""
    from sglang_omni.serve.ops.startup import run_server

    model_name = args.model_name or (DEMO_MODEL_NAME if args.demo else None)
    return run_server(config, sock, host=args.host, port=args.port, model_name=model_name,
                      log_level=args.log_level, log_format=args.log_format,
                      log_polls=args.log_polls)


if __name__ == "__main__":
    sys.exit(main())
