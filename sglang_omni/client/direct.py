"""The SDK's direct generation calls (a ``Cosmos3PipelineConfig`` server), mixed into ``Client``.

Every call that makes media saves it into the caller's ``output_dir`` (created if needed) as
``file_name`` (default: the request or job id) plus ``.png``/``.mp4``/``.json``, never over an
existing file, and returns the saved paths: the files belong to the caller, and the server keeps
no copy (a finished video job is deleted once it is saved; a job is deleted, which aborts it, if
waiting for it fails, times out, is cancelled or is interrupted).

Media to condition on: a ``str`` is a reference the server reads (a URL, a ``data:`` URL, or a
path under the server's ``--allowed-local-media-path``); a :class:`~pathlib.Path` or ``bytes``
is uploaded in a form, as native clients do.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

import httpx

from sglang_omni.client.types import GenerationCancelled, OmniClientError
from sglang_omni.client.wire import raise_for

Media = str | Path | bytes
#: ``on_progress(progress, status)``: a video job's percent done and status, on every poll.
Progress = Callable[[int, str], None]


def save_new(path: Path, data: bytes) -> Path:
    """Write ``data`` to a file that must not exist yet."""
    with open(path, "xb") as f:
        f.write(data)
    return path


def _folder(output_dir: str | Path, file_name: str | None) -> Path:
    if file_name is not None and (not file_name or Path(file_name).name != file_name):
        raise ValueError("file_name must be a plain file name without folders")
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _upload(name: str, media: Path | bytes) -> tuple[str, tuple[str, bytes]]:
    if isinstance(media, Path):
        return name, (media.name, media.read_bytes())
    return name, (name, bytes(media))


def _form(fields: dict[str, Any]) -> dict[str, str]:
    """Form text fields: numbers and booleans as text, lists and objects as JSON."""
    out = {}
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, dict | list):
            out[key] = json.dumps(value)
        else:
            out[key] = str(value)
    return out


class DirectGeneration:
    """``generate_image``, ``generate_video``, ``generate_action`` (see the module docstring)."""

    _http: httpx.Client

    def _post(self, path: str, fields: dict[str, Any],
              uploads: list[tuple[str, tuple[str, bytes]]]) -> httpx.Response:
        if uploads:
            resp = self._http.post(path, data=_form(fields), files=uploads)
        else:
            resp = self._http.post(path, json=fields)
        raise_for(resp)
        return resp

    # --- images --------------------------------------------------------------------------------
    def generate_image(self, prompt: str, *, output_dir: str | Path,
                       file_name: str | None = None, image: Media | None = None,
                       response_format: str = "b64_json", **fields: Any) -> list[Path]:
        """One image, saved as PNG. With ``image`` it is an edit (``/v1/images/edits``, a form):
        a ``str`` is sent as ``url``, a path or bytes uploaded as ``image``. ``response_format``
        ``url`` fetches the image from ``GET /v1/images/{id}/content``. ``fields`` are the
        native route's (``size``, ``seed``, ...)."""
        folder = _folder(output_dir, file_name)
        body = {**fields, "prompt": prompt, "response_format": response_format}
        if image is None:
            out = self._post("/v1/images/generations", body, []).json()
        else:
            uploads = [] if isinstance(image, str) else [_upload("image", image)]
            if isinstance(image, str):
                body["url"] = image
            out = self._http_edit(body, uploads)
        item = out["data"][0]
        if "b64_json" in item:
            data = base64.b64decode(item["b64_json"])
        else:
            content = self._http.get(item["url"])
            raise_for(content)
            data = content.content
        return [save_new(folder / f"{file_name or out['id']}.png", data)]

    def _http_edit(self, body: dict[str, Any],
                   uploads: list[tuple[str, tuple[str, bytes]]]) -> dict[str, Any]:
        """An edit is a form, as native reads it (URL-encoded when nothing is uploaded)."""
        resp = self._http.post("/v1/images/edits", data=_form(body), files=uploads or None)
        raise_for(resp)
        return dict(resp.json())

    # --- videos --------------------------------------------------------------------------------
    def generate_video(self, prompt: str, *, output_dir: str | Path,
                       file_name: str | None = None, input_reference: Media | None = None,
                       video_reference: Media | None = None, poll_interval_s: float = 1.0,
                       timeout_s: float | None = None, on_progress: Progress | None = None,
                       cancel: threading.Event | None = None, **fields: Any) -> list[Path]:
        """One video job, waited for and saved as MP4. ``input_reference`` (an image or video)
        and ``video_reference`` condition it; ``on_progress`` hears the job's progress on each
        poll; setting ``cancel`` (or passing ``timeout_s``) deletes the job, which aborts the
        generation, and raises :class:`GenerationCancelled` (or ``TimeoutError``)."""
        folder = _folder(output_dir, file_name)
        body: dict[str, Any] = {**fields, "prompt": prompt}
        uploads = []
        for name, media in (("input_reference", input_reference),
                            ("video_reference", video_reference)):
            if isinstance(media, str):
                body[name] = media
            elif media is not None:
                uploads.append(_upload(name, media))
        video_id = self._post("/v1/videos", body, uploads).json()["id"]
        try:
            job = self._wait_video(video_id, poll_interval_s, timeout_s, on_progress, cancel)
            if job["status"] != "completed":
                error = job.get("error") or {}
                raise OmniClientError(int(error.get("code", 500)),
                                      str(error.get("message", "the video generation failed")),
                                      str(error.get("type", "server_error")))
            content = self._http.get(f"/v1/videos/{video_id}/content")
            raise_for(content)
            return [save_new(folder / f"{file_name or video_id}.mp4", content.content)]
        finally:
            self._forget_video(video_id)

    def _wait_video(self, video_id: str, poll_interval_s: float, timeout_s: float | None,
                    on_progress: Progress | None,
                    cancel: threading.Event | None) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            resp = self._http.get(f"/v1/videos/{video_id}")
            raise_for(resp)
            job = dict(resp.json())
            if on_progress is not None:
                on_progress(int(job.get("progress") or 0), str(job["status"]))
            if job["status"] in ("completed", "failed"):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"video {video_id} did not finish within {timeout_s:g} s; "
                                   "it was deleted, which aborted its generation")
            if cancel is not None and cancel.wait(poll_interval_s):
                raise GenerationCancelled(f"video {video_id} was cancelled; it was deleted, "
                                          "which aborted its generation")
            if cancel is None:
                time.sleep(poll_interval_s)

    def _forget_video(self, video_id: str) -> None:
        """Delete the job (aborting it if it still runs); the server expires it otherwise."""
        with contextlib.suppress(httpx.HTTPError):
            self._http.delete(f"/v1/videos/{video_id}")

    # --- actions -------------------------------------------------------------------------------
    @overload
    def generate_action(self, request: dict[str, Any], *, output_dir: None = None,
                        file_name: str | None = None) -> dict[str, Any]: ...

    @overload
    def generate_action(self, request: dict[str, Any], *, output_dir: str | Path,
                        file_name: str | None = None) -> list[Path]: ...

    def generate_action(self, request: dict[str, Any], *, output_dir: str | Path | None = None,
                        file_name: str | None = None) -> dict[str, Any] | list[Path]:
        """One request to the native action route (``/v1/actions/generations``). Without
        ``output_dir`` it returns the response body (``data[0].action.values`` holds the
        ``[horizon, raw_action_dim]`` values); with it, the body is saved as JSON there and the
        saved path returned."""
        folder = None if output_dir is None else _folder(output_dir, file_name)
        out = dict(self._post("/v1/actions/generations", request, []).json())
        if folder is None:
            return out
        name = f"{file_name or out.get('id') or out.get('request_id')}.json"
        return [save_new(folder / name, json.dumps(out).encode())]

    # --- the interleaved-era name ----------------------------------------------------------------
    def generate_media(self, prompt: str, *, output_dir: str | Path, kind: str = "image",
                       file_name: str | None = None, poll_interval_s: float = 1.0,
                       **fields: Any) -> list[Path]:
        """``generate_image`` (``kind="image"``) or ``generate_video`` (``kind="video"``)."""
        if kind == "image":
            return self.generate_image(prompt, output_dir=output_dir, file_name=file_name,
                                       **fields)
        if kind == "video":
            return self.generate_video(prompt, output_dir=output_dir, file_name=file_name,
                                       poll_interval_s=poll_interval_s, **fields)
        raise ValueError(f"kind must be 'image' or 'video', got {kind!r}")
