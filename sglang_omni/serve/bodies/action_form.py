"""A form sent to ``POST /v1/actions/generations``, arranged as native arranges it.

Native reads a form into ``{"input": {"task", "observation"}, "parameters"}``: ``prompt`` (or
``task``) is the task; the first of the ``video_reference``, ``image_reference`` and
``input_reference`` uploads is the observation (``video``, ``image``, or for
``input_reference`` a video in ``inverse_dynamics`` mode or when it is one, else
``input_reference``); ``video_path``/``video_url``/``reference_url``/``input_reference`` text
fields fill an observation slot still free; ``extra_body``/``extra_params`` (JSON objects) and
every other field are parameters. The form value arrives here from
:func:`~sglang_omni.serve.bodies.body_formats.form_value` (uploads are ``data:`` URLs).
"""

from __future__ import annotations

from typing import Any

from sglang_omni.errors import BadRequest
from sglang_omni.serve.bodies.request_body import parse_json
from sglang_omni.serve.direct.fields import is_video_source

NOT_PARAMETERS = ("extra_body", "extra_params", "id", "image_reference", "input_reference",
                  "prompt", "reference_url", "request_id", "task", "video_reference",
                  "video_path", "video_url")
UPLOADS = ("video_reference", "image_reference", "input_reference")


def _extra(value: Any, name: str) -> dict[str, Any]:
    if value in (None, ""):
        return {}
    if isinstance(value, str):
        value = parse_json(value.encode(), 64)
    if not isinstance(value, dict):
        raise BadRequest(f"{name}: expected a JSON object")
    out = dict(value)
    if "guardrails" in out:
        out.setdefault("use_guardrails", out.pop("guardrails"))
    return out


def action_body_from_form(form: dict[str, Any], uploads: set[str]) -> dict[str, Any]:
    """The native action body a form stands for; ``uploads`` names the fields that were
    files."""
    parameters = {k: v for k, v in form.items() if k not in NOT_PARAMETERS}
    parameters.update(_extra(form.get("extra_body"), "extra_body"))
    parameters.update(_extra(form.get("extra_params"), "extra_params"))
    mode = str(parameters.get("action_mode", "policy")).strip().lower()
    inverse = mode == "inverse_dynamics"
    observation: dict[str, Any] = {}
    for name, slot in (("video_reference", "video"), ("image_reference", "image"),
                       ("input_reference", None)):
        if name in uploads and form.get(name) is not None:
            if slot is None:
                slot = "video" if inverse or is_video_source(form[name]) else "input_reference"
            observation[slot] = form[name]
            break
    for name, slot in (("video_path", "video"), ("video_url", "video"),
                       ("reference_url", "video" if inverse else "image"),
                       ("input_reference", "video" if inverse else "input_reference")):
        value = form.get(name)
        if name not in uploads and isinstance(value, str) and value and slot not in observation:
            observation[slot] = value
    body: dict[str, Any] = {"input": {"task": form.get("prompt") or form.get("task") or "",
                                      "observation": observation},
                            "parameters": parameters}
    request_id = form.get("request_id") or form.get("id")
    if request_id is not None:
        body["request_id"] = request_id
    return body
