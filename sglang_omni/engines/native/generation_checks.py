"""Startup and output checks of the native generation stage (no sglang imports here).

* Audiovisual generation needs the full checkpoint (a ``sound_tokenizer`` and a transformer
  built with ``sound_gen``) and an FFmpeg with the AAC encoder; checked at startup when
  ``factory.audio`` is on.
* A generated file is read back and must be a non-empty file of the expected type inside the
  request's output folder.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from sglang_omni.errors import ServerError
from sglang_omni.media.types import MIME_BY_KIND, media_type_of

AUDIO_FLAG = "stages.generation.factory.audio"


class AudioUnsupported(RuntimeError):
    """Audiovisual generation was asked for, but the checkpoint or FFmpeg cannot do it."""


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise AudioUnsupported(f"audiovisual generation ({AUDIO_FLAG}: true) needs the full "
                               f"Cosmos3 Nano checkpoint, but {path} cannot be read: {exc}") \
            from None
    return data if isinstance(data, dict) else {}


def check_audio_checkpoint(model_path: str | None) -> None:
    """AudioUnsupported unless the checkpoint carries the sound tokenizer and sound head."""
    if not model_path:
        raise AudioUnsupported(f"audiovisual generation ({AUDIO_FLAG}: true) needs model_path "
                               "to name the full Cosmos3 Nano checkpoint")
    root = Path(model_path)
    if "sound_tokenizer" not in _json(root / "model_index.json"):
        raise AudioUnsupported(
            f"audiovisual generation ({AUDIO_FLAG}: true) needs the full Cosmos3 Nano "
            f"checkpoint, but {root / 'model_index.json'} lists no sound_tokenizer; use the "
            f"full checkpoint or set {AUDIO_FLAG} to false")
    if not _json(root / "transformer" / "config.json").get("sound_gen"):
        raise AudioUnsupported(
            f"audiovisual generation ({AUDIO_FLAG}: true) needs the full Cosmos3 Nano "
            f"checkpoint, but {root / 'transformer' / 'config.json'} does not enable "
            f"sound_gen; use the full checkpoint or set {AUDIO_FLAG} to false")


def check_ffmpeg_aac(ffmpeg: str) -> None:
    """AudioUnsupported unless ``ffmpeg`` runs and lists the ``aac`` encoder."""
    try:
        out = subprocess.run([ffmpeg, "-hide_banner", "-encoders"], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AudioUnsupported(
            f"audiovisual generation ({AUDIO_FLAG}: true) needs FFmpeg with AAC, but {ffmpeg} "
            f"does not run: {exc}; point IMAGEIO_FFMPEG_EXE at an FFmpeg built with AAC") \
            from None
    encoders = {line.split()[1] for line in out.stdout.splitlines()
                if len(line.split()) > 1 and line.split()[0][:1] == "A"}
    if "aac" not in encoders:
        raise AudioUnsupported(
            f"audiovisual generation ({AUDIO_FLAG}: true) needs FFmpeg with the AAC encoder, "
            f"but {ffmpeg} has none; point IMAGEIO_FFMPEG_EXE at an FFmpeg built with AAC or "
            f"set {AUDIO_FLAG} to false")


def read_generated(path: str, folder: Path, kind: str) -> tuple[bytes, str]:
    """The bytes and MIME type of the file native wrote for a ``kind`` generation.

    ServerError when it lies outside the request's folder, is missing or empty, or is not an
    image (PNG, JPEG, WebP) or an MP4 video as ``kind`` says.
    """
    file = Path(path).resolve()
    if not file.is_relative_to(folder.resolve()):
        raise ServerError(f"native SGLang wrote the {kind} to {file}, outside the request's "
                          "output folder")
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ServerError(f"the generated {kind} file cannot be read: {exc}") from None
    if not data:
        raise ServerError(f"native SGLang wrote an empty {kind} file")
    mime = media_type_of(kind, data)
    if mime is None:
        raise ServerError(f"the generated {kind} file {file.name} is not "
                          f"{' or '.join(MIME_BY_KIND[kind])}")
    return data, mime
