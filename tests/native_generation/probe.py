"""Act as the native generation stage towards the real SGLang 0.5.23 plugin loader, on the CPU.

Run as ``python -m tests.native_generation.probe OUT.json``. It provides the cancellation plugin
exactly as the stage does (``CancellationPluginSite`` with the real driver's own plugin
registration), lets the real loader run in this process as ``DiffGenerator`` would, then starts,
at the same time:

* a worker through SGLang's own ``bootstrap_scheduler_process``, spawned as ``launch_server``
  spawns workers (its server arguments are a placeholder, so it stops once the plugins are
  loaded and applied; its registration report shows what the loader did);
* a probe worker, spawned the same way, that initializes the platform, loads and applies the
  plugins in the bootstrap's order, then checks the hook targets and drives the hooked
  denoising step;
* an unrelated process (another SGLang process on the machine) that loads plugins.

Everything it sees goes to ``OUT.json``. The sglang imports stay inside functions, so spawned
children re-importing this module do not import sglang early.
"""

from __future__ import annotations

import inspect
import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang_omni.engines.native import cancellation_plugin as plugin
from sglang_omni.engines.native.cancellation_plugin_site import CancellationPluginSite

OUTSIDER = """
import json
from importlib.metadata import entry_points
from sglang.multimodal_gen.runtime.platforms import initialize_current_platform
initialize_current_platform()
from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry, load_plugins
load_plugins()
print(json.dumps({
    "entry_points": [e.name for e in entry_points(group="sglang.multimodal_gen.plugins")],
    "hooked_targets": sorted(HookRegistry._hooks)}))
"""


def _omni_hooks(registry: Any) -> list[str]:
    return sorted(target for target, hooks in registry._hooks.items()
                  if any(src and src.plugin_name == plugin.PLUGIN_NAME for _, _, src in hooks))


def probe_worker(conn: Any, folder: str) -> None:
    """A worker started like native ones: platform, plugins, hooks; then the checks."""
    from sglang.multimodal_gen.runtime.platforms import initialize_current_platform

    initialize_current_platform()
    from sglang.multimodal_gen.runtime.platforms.plugins import (
        HookRegistry,
        apply_plugin_hooks,
        load_plugins,
    )

    load_plugins()
    apply_plugin_hooks()
    from sglang.multimodal_gen.runtime.models.dits.cosmos3video import Cosmos3OmniTransformer
    from sglang.multimodal_gen.runtime.pipelines_core.stages.model_specific_stages.cosmos3 import (  # noqa: E501
        Cosmos3DenoisingStage,
    )

    step_fn = Cosmos3OmniTransformer.set_denoising_step
    loop_fn = Cosmos3DenoisingStage._denoise_once
    report: dict[str, Any] = {
        "process": mp.current_process().name,
        "omni_hooks": _omni_hooks(HookRegistry),
        "patched": sorted(t for t in HookRegistry._patched if t in plugin.HOOK_TARGETS),
        "step_wrapped": hasattr(step_fn, "__wrapped__"),
        "loop_wrapped": hasattr(loop_fn, "__wrapped__"),
        "step_signature": str(inspect.signature(getattr(step_fn, "__wrapped__", step_fn))),
        "loop_signature": str(inspect.signature(getattr(loop_fn, "__wrapped__", loop_fn))),
    }
    # The hooked per-step call of the Cosmos3 denoising loop, inside a request's loop scope.
    transformer = SimpleNamespace(step_precision_controller=None)
    steps: list[int] = []
    try:
        with plugin.denoising_request(folder):
            for i in range(6):
                Cosmos3OmniTransformer.set_denoising_step(transformer, step_index=i,
                                                          num_steps=6)
                steps.append(i)
                if i == 2:
                    plugin.request_cancel(folder)
    except plugin.GenerationCancelled as exc:
        report["step_error"] = str(exc)
    report["steps_run"] = steps
    # Uncancelled requests are not touched; the hooked loop entry stops a cancelled one.
    other = tempfile.mkdtemp()
    with plugin.denoising_request(other):
        Cosmos3OmniTransformer.set_denoising_step(transformer, step_index=0, num_steps=1)
    try:
        Cosmos3DenoisingStage._denoise_once(object(), SimpleNamespace(output_path=folder), None)
    except plugin.GenerationCancelled as exc:
        report["loop_error"] = str(exc)
    except Exception as exc:  # noqa: BLE001 - reported, the test says what was expected
        report["loop_error"] = repr(exc)
    conn.send(report)


def main(out: str) -> None:
    from sglang.multimodal_gen.runtime.managers.worker_bootstrap import (
        SchedulerProcessSpec,
        ServerArgsPayload,
        bootstrap_scheduler_process,
    )
    from sglang.multimodal_gen.runtime.platforms.plugins import HookRegistry, apply_plugin_hooks

    from sglang_omni.engines.native.generation_driver import SGLangDiffusion

    report: dict[str, Any] = {}
    site = CancellationPluginSite()
    try:
        site.activate(SGLangDiffusion().register_own_plugins)
        apply_plugin_hooks()  # what DiffGenerator.from_pretrained does first
        report["stage"] = {"omni_hooks": _omni_hooks(HookRegistry), "pid": os.getpid()}
        ctx = mp.get_context("spawn")
        reader, writer = ctx.Pipe(duplex=False)
        spec = SchedulerProcessSpec(0, 0, ServerArgsPayload(pickle.dumps(None)), writer)
        bootstrap = ctx.Process(target=bootstrap_scheduler_process, args=(spec,),
                                name="sglang-diffusionWorker-0", daemon=True)
        ours, theirs = ctx.Pipe()
        folder = tempfile.mkdtemp()
        worker = ctx.Process(target=probe_worker, args=(theirs, folder),
                             name="sglang-diffusionWorker-1", daemon=True)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", plugin.STATUS_DIR_ENV)}
        outsider = subprocess.Popen([sys.executable, "-c", OUTSIDER], env=env,
                                    stdout=subprocess.PIPE, text=True)
        bootstrap.start()
        worker.start()
        report["worker"] = ours.recv() if ours.poll(600) else {"error": "no report"}
        bootstrap.join(600)
        worker.join(60)
        stdout, _ = outsider.communicate(timeout=600)
        report["bootstrap"] = {"pid": bootstrap.pid, "exitcode": bootstrap.exitcode}
        report["registrations"] = site.registrations()
        report["outsider"] = json.loads(stdout.strip().splitlines()[-1])
        report["site"] = str(site.path)
    finally:
        site.close()
    report["site_removed"] = not Path(report.get("site", site.path)).exists()
    Path(out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main(sys.argv[1])
