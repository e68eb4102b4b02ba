"""Progress from the hf generator: diffusers' ``callback_on_step_end`` steps reach the client
as progress events (the scripted Reasoner in front of it; tests/progress has the rest)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.kit import parse_sse, script
from tests.server import SCRIPTED_UMM, Server


def test_hf_generation_reports_its_step_callback(tiny_checkpoint: Path) -> None:
    with Server(*SCRIPTED_UMM, "--generation.factory.backend", "hf",
                "--model-path", str(tiny_checkpoint), timeout=180) as hf:
        body = {"prompt": script({"action": "image", "prompt": "a cube"},
                                 {"action": "final", "text": "ok"}),
                "stream": True, "include_progress": True,
                "stage_params": {"generation": {"width": 32, "height": 32,
                                                "num_inference_steps": 3}}}
        with httpx.stream("POST", f"{hf.url}/generate", json=body, timeout=120) as resp:
            events = parse_sse(resp.read().decode())
    steps = [(p["step"], p["steps"]) for e, p in events
             if e == "progress" and p["stage"] == "generation" and "spans" not in p]
    assert steps == [(0, 3), (1, 3), (2, 3), (3, 3)], steps
    # the generation's end says where its time went: the steps, then the VAE decode
    ended = [p["spans"] for e, p in events
             if e == "progress" and p["stage"] == "generation" and "spans" in p]
    assert len(ended) == 1 and ended[0]["denoise"] > 0 and ended[0]["vae_decode"] > 0, ended
    assert [d["kind"] for e, d in events if e == "segment"] == ["image", "text"]
