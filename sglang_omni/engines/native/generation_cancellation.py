"""How the native generation stage stops an aborted request, decided once at startup.

* ``native``: the installed SGLang cancels a generation itself (its ``DiffGenerator`` has an
  abort method); Omni uses that and provides no plugin.
* ``plugin``: the ``omni_generation_cancellation`` plugin, provided to the stage's own native
  workers, stops the generation within about one denoising step.
* ``none``: neither is possible or wanted; an aborted request keeps the generation stage busy
  until its native generation finishes. Startup logs a warning naming the reason.

If ``SGLANG_PLUGINS`` is set, native SGLang loads only the plugins it lists, so in ``plugin``
mode it must list ``omni_generation_cancellation``; otherwise startup stops with a message
saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sglang_omni.engines.native.cancellation_plugin import PLUGIN_NAME

#: Methods a later ``DiffGenerator`` may offer to cancel a generation by request id.
NATIVE_ABORT_METHODS = ("abort_request", "abort")
PLUGIN_FLAG = "stages.generation.factory.cancellation_plugin"


class PluginNotAllowed(RuntimeError):
    """``SGLANG_PLUGINS`` is set and leaves out the cancellation plugin."""


@dataclass(frozen=True)
class CancellationPlan:
    """``mode`` is ``native``, ``plugin`` or ``none``; ``reason`` says why, for the log."""

    mode: str
    reason: str

    @property
    def warning(self) -> str | None:
        """The startup warning of ``none`` mode (None otherwise)."""
        if self.mode != "none":
            return None
        return (f"generation cancellation is off: {self.reason}; an aborted request keeps the "
                "generation stage busy until its native generation finishes")


def native_abort_method(generator_cls: type | None) -> str | None:
    """The name of the abort method ``generator_cls`` offers, or None (SGLang 0.5.23 has none)."""
    if generator_cls is None:
        return None
    return next((name for name in NATIVE_ABORT_METHODS
                 if callable(getattr(generator_cls, name, None))), None)


def check_plugin_allowlist(env: Mapping[str, str]) -> None:
    """PluginNotAllowed when ``SGLANG_PLUGINS`` is set without ``omni_generation_cancellation``."""
    value = env.get("SGLANG_PLUGINS")
    if value is None or not value.strip():
        return  # unset or empty: native SGLang loads every plugin it finds
    names = [n.strip() for n in value.split(",") if n.strip()]
    if PLUGIN_NAME not in names:
        raise PluginNotAllowed(
            f"SGLANG_PLUGINS is set to {value!r}, which does not list {PLUGIN_NAME}, so the "
            f"native generation workers would not load Omni's cancellation plugin; add it "
            f"(SGLANG_PLUGINS={','.join([*names, PLUGIN_NAME])}) or unset SGLANG_PLUGINS")


def plan_cancellation(*, plugin_enabled: bool, num_gpus: int, native_abort: str | None,
                      env: Mapping[str, str]) -> CancellationPlan:
    """Choose the mode; raises PluginNotAllowed in ``plugin`` mode (see the module docstring)."""
    if native_abort is not None:
        return CancellationPlan("native", f"the installed SGLang cancels generations itself "
                                          f"(DiffGenerator.{native_abort}); the "
                                          f"{PLUGIN_NAME} plugin is not needed")
    if not plugin_enabled:
        return CancellationPlan("none", f"the {PLUGIN_NAME} plugin is turned off "
                                        f"({PLUGIN_FLAG}: false)")
    if num_gpus > 1:
        return CancellationPlan("none", f"generation uses {num_gpus} native GPUs and the "
                                        f"{PLUGIN_NAME} plugin serves a single one (ranks "
                                        "could stop at different denoising steps)")
    check_plugin_allowlist(env)
    return CancellationPlan("plugin", f"the {PLUGIN_NAME} plugin stops an aborted generation "
                                      "within about one denoising step")
