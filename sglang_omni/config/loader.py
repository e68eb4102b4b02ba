"""Merge a YAML file and dotted CLI overrides into a validated ``ResolvedConfig``.

Precedence: class defaults < file < flags. Every refusal is a ``ConfigError`` whose message
names the key and the fix.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

from sglang_omni.config.gpus import visible_gpu_count
from sglang_omni.config.model_imports import check_module_name
from sglang_omni.config.schema import (
    CPU_BACKENDS,
    FactoryField,
    ResolvedConfig,
    StageConfig,
    StageSpec,
    pipeline_class,
    text_only_pipeline,
)
from sglang_omni.config.server import API_KEY_ENV, resolve_server_settings
from sglang_omni.errors import ConfigError

TOP_LEVEL_KEYS = ("config_cls", "model_path", "stages", "allowed_local_media_path",
                  "allowed_media_domain", "server", "model_packages")
STAGE_KEYS = ("gpu", "gpu_memory_fraction", "factory", "engine")


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Parse ``--stage.key value`` / ``--stage.key=value`` pairs; values are YAML scalars.

    ``--reasoner.gpu null`` gives None, ``--reasoner.gpu 3`` gives 3. Raises ConfigError for
    anything that is not a dotted flag with a value.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError(
                f"unrecognized argument {arg!r}; overrides look like --reasoner.gpu 1 or "
                "--generation.factory.output_dir out"
            )
        key = arg[2:]
        if "=" in key:
            key, raw = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError(f"{arg} needs a value, for example {arg} 1")
            raw = args[i + 1]
            i += 2
        try:
            out[key] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            out[key] = raw
    return out


def _read_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"--config {path}: cannot read the file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML ({exc})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: the top level must be a mapping with config_cls")
    return data


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    if parts[0] == "server":
        if len(parts) != 2:
            raise ConfigError(f"--{dotted}: name one server setting, for example "
                              "--server.max_body_bytes 1048576")
        node = raw.setdefault("server", {})
        if not isinstance(node, dict):
            raise ConfigError("server: must be a mapping of setting to value")
        node[parts[1]] = value
        return
    if parts[0] in TOP_LEVEL_KEYS and parts[0] != "stages":
        if len(parts) != 1:
            raise ConfigError(f"--{dotted}: {parts[0]} has no sub-keys")
        raw[parts[0]] = value
        return
    if parts[0] == "stages":
        parts = parts[1:]
    if len(parts) < 2:
        raise ConfigError(f"--{dotted}: name a stage field, for example --reasoner.gpu 1")
    node = raw.setdefault("stages", {})
    if not isinstance(node, dict):
        raise ConfigError("stages: must be a mapping of stage name to its fields")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--{dotted}: {part} is not a mapping")
        node = child
    node[parts[-1]] = value


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join("number" if t is float else t.__name__ for t in types)


def _check_factory_value(key: str, fld: FactoryField, value: Any) -> Any:
    ok = isinstance(value, fld.types) and not (isinstance(value, bool) and bool not in fld.types)
    if value is None and fld.default is None:
        return None
    if not ok:
        raise ConfigError(
            f"{key}: expected {_type_name(fld.types)}, got {type(value).__name__} {value!r}"
        )
    if fld.choices is not None and value not in fld.choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, fld.choices))}")
    if fld.minimum is not None and value < fld.minimum:
        raise ConfigError(f"{key}: {value!r} is below the minimum {fld.minimum}")
    return value


def _resolve_stage(spec: StageSpec, raw: Any, visible: int) -> StageConfig:
    prefix = f"stages.{spec.name}"
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix}: must be a mapping with gpu, gpu_memory_fraction, factory, "
                          "engine")
    for key in raw:
        if key not in STAGE_KEYS:
            raise ConfigError(
                f"{prefix}.{key}: unknown stage field; a stage has {', '.join(STAGE_KEYS)}"
            )
    gpu = raw.get("gpu", spec.default_gpu)
    if not spec.process:
        if raw.get("gpu") is not None or raw.get("gpu_memory_fraction") is not None:
            raise ConfigError(f"{prefix}.gpu: the {spec.name} stage runs on the CPU in the server "
                              "process; remove gpu and gpu_memory_fraction")
        gpu = None
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
        raise ConfigError(f"{prefix}.gpu: expected a visible GPU index (0, 1, ...) or null for "
                          f"the CPU, got {gpu!r}")
    frac = raw.get("gpu_memory_fraction")
    if frac is not None and (isinstance(frac, bool) or not isinstance(frac, int | float)
                             or not 0 < frac <= 1):
        raise ConfigError(f"{prefix}.gpu_memory_fraction: expected a number in (0, 1], got "
                          f"{frac!r}")
    factory_raw = raw.get("factory") or {}
    if not isinstance(factory_raw, dict):
        raise ConfigError(f"{prefix}.factory: must be a mapping")
    factory: dict[str, Any] = {}
    for key, fld in spec.factory_fields.items():
        factory[key] = copy.deepcopy(fld.default)
    for key, value in factory_raw.items():
        found = spec.factory_fields.get(key)
        if found is None:
            known = ", ".join(sorted(spec.factory_fields))
            raise ConfigError(f"{prefix}.factory.{key}: unknown option; {spec.name} takes {known}")
        factory[key] = _check_factory_value(f"{prefix}.factory.{key}", found, value)
    engine = raw.get("engine") or {}
    if not isinstance(engine, dict):
        raise ConfigError(f"{prefix}.engine: must be a mapping of native server arguments")
    stage = StageConfig(spec.name, spec.role, spec.process, gpu,
                        float(frac) if frac is not None else None, factory, dict(engine))
    _check_placement(prefix, stage, visible)
    return stage


def _check_placement(prefix: str, stage: StageConfig, visible: int) -> None:
    if not stage.process:
        return
    if stage.gpu is None:
        if stage.backend not in CPU_BACKENDS:
            raise ConfigError(
                f"{prefix}.gpu: null places the stage on the CPU, but the {stage.backend} "
                f"backend needs a GPU; set {prefix}.gpu to a visible GPU index, or "
                f"{prefix}.factory.backend to one of {', '.join(CPU_BACKENDS)}"
            )
        return
    if stage.gpu >= visible:
        raise ConfigError(
            f"{prefix}.gpu: {stage.gpu} needs {stage.gpu + 1} visible GPU(s) but {visible} "
            f"{'is' if visible == 1 else 'are'} visible; set {prefix}.gpu (--{stage.name}.gpu) "
            "to a visible index, or to null to run a scripted/hf backend on the CPU"
        )


def _model_packages(value: Any) -> tuple[str, ...]:
    """``model_packages``: module names (a list, or one name) whose import registers model
    packages outside Omni (their pipeline config classes, selectable as ``config_cls``)."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list):
        raise ConfigError(f"model_packages: expected a list of module names, got {value!r}")
    return tuple(check_module_name(name) for name in names)


def load_config(
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    model_path: str | None = None,
    text_only: bool = False,
    allowed_local_media_path: str | None = None,
    allowed_media_domain: list[str] | None = None,
    api_key: str | None = None,
    visible_gpus: int | None = None,
) -> ResolvedConfig:
    """Resolve the configuration the server runs; raises ConfigError naming key and fix.

    ``api_key`` (``--api-key``) outranks ``server.api_key``, which outranks the
    ``SGLANG_OMNI_API_KEY`` environment variable."""
    raw: dict[str, Any] = _read_file(config_file) if config_file else {}
    for key in raw:
        if key not in TOP_LEVEL_KEYS:
            raise ConfigError(f"{key}: unknown top-level key; use {', '.join(TOP_LEVEL_KEYS)}")
    if text_only:
        text_only_cls = text_only_pipeline(_model_packages(raw.get("model_packages")))
        if config_file and raw.get("config_cls") not in (None, text_only_cls):
            raise ConfigError(f"--text-only selects {text_only_cls}; the file asks for "
                              f"{raw.get('config_cls')}: drop one of them")
        raw["config_cls"] = text_only_cls
    if model_path is not None:
        raw["model_path"] = model_path
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    if allowed_local_media_path is not None:
        raw["allowed_local_media_path"] = allowed_local_media_path
    if allowed_media_domain:
        raw["allowed_media_domain"] = list(allowed_media_domain)

    cls_name = raw.get("config_cls")
    if not cls_name:
        raise ConfigError("config_cls: missing; set it in the file (for example "
                          "Cosmos3UMMPipelineConfig) or pass --text-only")
    if not isinstance(cls_name, str):
        raise ConfigError(f"config_cls: expected a class name, got {cls_name!r}")
    packages = _model_packages(raw.get("model_packages"))
    cls = pipeline_class(cls_name, packages)
    mp = raw.get("model_path")
    if mp is not None and not isinstance(mp, str):
        raise ConfigError(f"model_path: expected a path, got {mp!r}")
    stages_raw = raw.get("stages") or {}
    if not isinstance(stages_raw, dict):
        raise ConfigError("stages: must be a mapping of stage name to its fields")
    declared = [s.name for s in cls.stage_specs]
    for name in stages_raw:
        if name not in declared:
            raise ConfigError(
                f"stages.{name}: {cls_name} has no stage {name!r}; its stages are "
                f"{', '.join(declared)} (stages cannot be added or removed)"
            )
    visible = visible_gpu_count() if visible_gpus is None else visible_gpus
    stages = {spec.name: _resolve_stage(spec, stages_raw.get(spec.name), visible)
              for spec in cls.stage_specs}
    if mp is None and any(s.process and s.backend != "scripted" for s in stages.values()):
        raise ConfigError("model_path: missing; set model_path in the file or pass --model-path")
    local = raw.get("allowed_local_media_path")
    if local is not None and not isinstance(local, str):
        raise ConfigError(f"allowed_local_media_path: expected a folder path, got {local!r}")
    domains = raw.get("allowed_media_domain") or []
    if isinstance(domains, str):
        domains = [domains]
    if not isinstance(domains, list) or not all(isinstance(d, str) and d for d in domains):
        raise ConfigError(f"allowed_media_domain: expected a list of host names, got {domains!r}")
    if api_key is not None:
        raw.setdefault("server", {})
        if isinstance(raw["server"], dict):
            raw["server"]["api_key"] = api_key
    server = resolve_server_settings(raw.get("server"), os.environ.get(API_KEY_ENV) or None)
    resolved = ResolvedConfig(cls_name, mp, stages, local, tuple(domains), server, packages)
    cls.validate(resolved)
    return resolved
