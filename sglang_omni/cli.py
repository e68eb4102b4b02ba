"""``sgl-omni``: serve a pipeline, or print its resolved configuration.

Imports stay light (no FastAPI, torch or sglang) until a command needs them, so ``--help`` works
on a bare machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from sglang_omni.errors import ConfigError

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
        "require 'Authorization: Bearer KEY' on every route but /health (or set "
        "SGLANG_OMNI_API_KEY, which keeps the key out of process listings)"))
    p.add_argument("--mem-fraction-static", type=float, metavar="F",
                   help="native SGLang memory fraction of the Reasoner (same as "
                        "--reasoner.engine.mem_fraction_static); wins over "
                        "stages.reasoner.gpu_memory_fraction")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sgl-omni", description=(
        "SGLang Omni: serve unified multimodal models (NVIDIA Cosmos3 Nano) on native SGLang."))
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start the HTTP server", epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--model-name", help="model id reported by /v1/models")
    serve.add_argument("--log-level", default="info",
                       choices=["debug", "info", "warning", "error"])
    serve.add_argument("--demo", action="store_true", help=(
        "serve the interleaved pipeline on the CPU with the hf backend and a tiny random-weight "
        "Cosmos3 checkpoint (built once into ~/.cache/sglang-omni; needs the hf extra)"))
    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    resolve = config_sub.add_parser("resolve", help="print the merged configuration",
                                    epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
    _config_args(resolve)
    tiny = sub.add_parser("make-tiny-checkpoint", help=(
        "build the tiny seeded random-weight Cosmos3 checkpoint (needs the hf extra)"))
    tiny.add_argument("dir", help="folder to create")
    tiny.add_argument("--seed", type=int, default=0)
    return parser


def _resolve(args: argparse.Namespace, extra: list[str]) -> Any:
    from sglang_omni.config import load_config, parse_overrides

    overrides = parse_overrides(extra)
    model_path = args.model_path
    if getattr(args, "demo", False):
        from sglang_omni.models.cosmos3 import tiny_checkpoint

        if args.config:
            raise ConfigError("--demo brings its own configuration; drop --config (flags such "
                              "as --port or --generation.engine.defaults still apply)")
        overrides = {**tiny_checkpoint.DEMO_OVERRIDES, **overrides}
        if model_path is None:
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
    try:
        config = _resolve(args, extra)
    except ConfigError as exc:
        print(f"sgl-omni: configuration error: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        print(json.dumps(config.to_dict(), indent=2))
        return 0
    return _serve(config, args)


def _serve(config: Any, args: argparse.Namespace) -> int:
    import uvicorn

    from sglang_omni.serve.app import create_app
    from sglang_omni.serve.connection import uvicorn_options

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s [server] %(levelname)s %(name)s: %(message)s")
    try:
        app = create_app(config, args.model_name, args.log_level)
    except ConfigError as exc:
        print(f"sgl-omni: configuration error: {exc}", file=sys.stderr)
        return 2
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port,
                                           log_level=args.log_level,
                                           timeout_graceful_shutdown=5,
                                           **uvicorn_options(config.server)))
    orchestrator = app.state.orchestrator
    orchestrator.on_fatal = lambda: setattr(server, "should_exit", True)
    server.run()
    if orchestrator.fatal_error is not None:
        print(f"sgl-omni: stopped: {orchestrator.fatal_error}", file=sys.stderr)
        return 1
    if not server.started:
        return 3  # startup failed (uvicorn's own exit code for it)
    return 0


if __name__ == "__main__":
    sys.exit(main())
