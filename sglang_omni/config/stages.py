"""Stage declarations shared by the pipeline config classes."""

from __future__ import annotations

from sglang_omni.config.schema import PROCESS_FACTORY, FactoryField, StageSpec

MiB = 1024 * 1024

ORCHESTRATOR_FACTORY: dict[str, FactoryField] = {
    "max_dispatches": FactoryField((int,), 17, "stage dispatches per request", minimum=1),
    "max_outputs": FactoryField((int,), 17, "segments per request", minimum=1),
    "max_active": FactoryField((int,), 32, "requests at once; more get 503", minimum=1),
    "max_retained_bytes": FactoryField((int,), 128 * MiB, "host bytes a request may hold",
                                       minimum=1),
    "timeout_s": FactoryField((int, float), 3600.0, "seconds a request may live", minimum=0.001),
}

GENERATION_FACTORY: dict[str, FactoryField] = {
    **PROCESS_FACTORY,
    "output_dir": FactoryField((str,), "outputs", "folder for the native per-request outputs"),
    "step_time_s": FactoryField((int, float), 0.0,
                                "scripted backend: seconds per simulated denoising step",
                                minimum=0),
    "pause_budget_bytes": FactoryField(
        (int,), 8 * 1024 * MiB, "device bytes the stage may keep for generations paused at a "
        "denoising step boundary while an older request's generation runs (their latents, "
        "scheduler state and captured step, all paused jobs together); a job that would exceed "
        "it is not paused (0: never pause). hf fast denoiser and scripted backends; native "
        "generation runs one job at a time whole", minimum=0),
    "cancellation_plugin": FactoryField(
        (bool,), True, "native backend: provide the omni_generation_cancellation plugin to the "
        "native workers (false: an aborted request keeps the stage busy until it finishes)"),
    "audio": FactoryField(
        (bool,), False, "native backend: serve audiovisual generation (checked at startup: full "
        "checkpoint and FFmpeg with AAC)"),
}

REASONER_FACTORY: dict[str, FactoryField] = {
    **PROCESS_FACTORY,
    "context_budget_bytes": FactoryField(
        (int,), 4 * 1024 * MiB, "hf backend: bytes the stage keeps of its running requests' "
        "contexts (each media item's processor and vision tower outputs, the K/V of the last "
        "turn), all requests together; the least recently used go first (0: keep none)",
        minimum=0),
    "native_lifecycle": FactoryField(
        (bool,), False, "scripted backend: treat children as native SGLang processes (one that "
        "exits stops the stage and the server)"),
}


def orchestrator_stage() -> StageSpec:
    return StageSpec("orchestrator", "orchestrator", None, process=False,
                     factory_fields=ORCHESTRATOR_FACTORY)


def generation_stage(default_gpu: int,
                     more: dict[str, FactoryField] | None = None) -> StageSpec:
    """The generation stage; ``more``: factory options a pipeline adds (its engines read them)."""
    return StageSpec("generation", "generation", default_gpu,
                     factory_fields={**GENERATION_FACTORY, **(more or {})})


def reasoner_stage(default_gpu: int) -> StageSpec:
    return StageSpec("reasoner", "reasoner", default_gpu, factory_fields=REASONER_FACTORY)
