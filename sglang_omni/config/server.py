"""Server-wide settings: who may call, request limits, connection timeouts.

They live under the config file's top-level ``server:`` mapping and are set from the command line
as ``--server.<key> VALUE`` (``--api-key`` and the ``SGLANG_OMNI_API_KEY`` environment variable
set ``api_key``). Every limit is checked before any model work; the defaults allow the model's
documented sizes (1280x720 and 1024x1024 images, 1280x720 videos of 189 frames, 100 steps) and
refuse what no machine can hold.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sglang_omni.errors import ConfigError

API_KEY_ENV = "SGLANG_OMNI_API_KEY"
MiB = 2**20
#: x264's presets, fastest first: ``media.encode.X264_PRESETS`` (config and media share a layer
#: and import neither; ``tests/foundation/test_x264_presets.py`` holds the two equal).
X264_PRESET_NAMES = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow",
                     "slower", "veryslow", "placebo")
#: The presets a request may name by default: those whose encode of the largest video the
#: default limits allow (1920x1088, 257 frames) costs at most twice the default preset's
#: (``stages.generation.factory.x264_preset``, medium). Measured by
#: ``benchmarks/encode_presets.py``: slow 1.4x medium, slower 5.5x, placebo 9.8x
#: (docs/configuration.md has the table).
DEFAULT_ALLOWED_X264_PRESETS = X264_PRESET_NAMES[:X264_PRESET_NAMES.index("slow") + 1]


@dataclass(frozen=True)
class ServerSettings:
    """The ``server:`` section. Field docs are the README's limit table."""

    #: Bearer key every route but /health, the API docs and the playground page requires
    #: (None: no authentication).
    api_key: str | None = None
    #: Largest request body in bytes (413 above it).
    max_body_bytes: int = 256 * MiB
    #: Request-body bytes the server reads and parses at once, all requests together, WebSocket
    #: messages buffered or waiting included (503 for a body that does not fit beside the
    #: others, 1013 for a WebSocket; one body always fits when it is alone).
    max_pending_body_bytes: int = 1024 * MiB
    #: Deepest JSON nesting of a request body (400 above it).
    max_json_depth: int = 64
    #: Most values (array items and object members, nested ones included) in one request body
    #: or WebSocket message, JSON or msgpack (400 above it): parsed values take many times
    #: their bytes.
    max_json_values: int = 1_000_000
    #: Media references (images, videos, audios, image_path, video_path...) one request may carry.
    max_media_parts: int = 32
    #: Total media bytes one request may fetch or decode from data URLs, all parts together.
    max_media_bytes: int = 256 * MiB
    #: Seconds a media host may stall (connect, or no byte received) before its fetch fails.
    media_fetch_timeout_s: float = 10.0
    #: Seconds one media fetch may take in all, redirects included (a trickling host fails).
    media_fetch_deadline_s: float = 60.0
    #: Seconds all the remote media of one request may take to fetch, fetched a few at a time
    #: (a request over it fails like a fetch that times out, 500).
    media_request_deadline_s: float = 120.0
    #: Client media bytes all running requests may hold at once (fetched, decoded or read by the
    #: server, kept by the Reasoner stage until the request ends; a direct generation's image
    #: and video inputs, read by the generation stage, until it ends). Each request reserves the
    #: most its media may take before any fetch (503 with Retry-After when that does not fit
    #: beside the others), and keeps what they took. The default is the spec's arithmetic:
    #: max_active (32) requests at max_retained_bytes (128 MiB) each, 4 GiB.
    max_client_media_bytes: int = 4096 * MiB
    #: Generation: largest width * height of one image or video frame.
    max_pixels: int = 1920 * 1088
    #: Generation: most frames of one video.
    max_frames: int = 257
    #: Generation: most denoising steps.
    max_inference_steps: int = 200
    #: Generation: longest video in seconds (num_frames / fps).
    max_video_seconds: float = 30.0
    #: Generation: largest width/height or height/width.
    max_aspect_ratio: float = 8.0
    #: Generation: the x264 presets a request's `x264_preset` may name (a list; another gets
    #: 400 naming the allowed ones). The default: those whose encode of the largest video these
    #: limits allow costs at most twice the default preset's (medium), as measured in
    #: [x264 presets](#x264-presets-a-request-may-ask-for); the server's own default preset
    #: (`stages.generation.factory.x264_preset`) applies whatever this says.
    allowed_x264_presets: tuple[str, ...] = DEFAULT_ALLOWED_X264_PRESETS
    #: Seconds an idle keep-alive connection stays open.
    idle_timeout_s: float = 5.0
    #: Seconds a client may take to send a request's headers.
    header_timeout_s: float = 10.0
    #: Seconds a client may take to send a request's body.
    body_timeout_s: float = 60.0
    #: Seconds a client may leave what the server sends unread once the connection's send
    #: buffer is full (a stream, a realtime video chunk); then it is disconnected as a client
    #: that left (its request cancelled) and what was buffered for it dropped, so a client that
    #: stopped reading holds neither its request nor its session nor the server's memory.
    send_timeout_s: float = 60.0
    #: Seconds between SSE keep-alive comments while a stream has nothing to send (0: off).
    sse_keepalive_s: float = 15.0
    #: Seconds a 503 answer tells the client to wait (Retry-After).
    retry_after_s: int = 5
    #: Direct generation: image and action requests queued or running at once (503 above it).
    max_direct_queue: int = 64
    #: Direct generation: seconds an image or action request may wait for the generation stage
    #: behind others before it is refused with 503 (one the queue ahead would keep waiting
    #: longer, at the measured time per request, is refused at once).
    direct_wait_s: float = 600.0
    #: Direct generation: most chunks one realtime video session may ask for (its max_chunks),
    #: also the number of chunks of a session that names none (400 above it).
    max_realtime_chunks: int = 100
    #: Seconds the requests in flight may still run after SIGTERM or SIGINT (new ones get 503
    #: meanwhile); the server then ends those still running with 503 "the server is shutting
    #: down" (a stream with its error event and [DONE]) and exits.
    shutdown_grace_s: float = 5.0

    def to_dict(self) -> dict[str, Any]:
        """The settings for ``sgl-omni config resolve``; the key itself is never printed."""
        out = asdict(self)
        out["api_key"] = None if self.api_key is None else "<set>"
        return out


_MINIMUM: dict[str, float] = {
    "max_body_bytes": 1, "max_pending_body_bytes": 1, "max_json_depth": 2, "max_json_values": 1,
    "max_media_parts": 0, "max_media_bytes": 1,
    "media_fetch_timeout_s": 0.001, "media_fetch_deadline_s": 0.001,
    "media_request_deadline_s": 0.001, "max_client_media_bytes": 1,
    "max_pixels": 1, "max_frames": 1, "max_inference_steps": 1, "max_video_seconds": 0.001,
    "max_aspect_ratio": 1, "idle_timeout_s": 0.001, "header_timeout_s": 0.001,
    "body_timeout_s": 0.001, "send_timeout_s": 0.001, "sse_keepalive_s": 0, "retry_after_s": 0,
    "max_direct_queue": 1, "direct_wait_s": 0.001, "max_realtime_chunks": 1,
    "shutdown_grace_s": 0,
}
KEYS = tuple(f.name for f in fields(ServerSettings))


def resolve_server_settings(raw: Any, api_key_env: str | None = None) -> ServerSettings:
    """Validate the ``server:`` mapping; ``api_key_env`` (the environment's key) fills
    ``api_key`` when the mapping leaves it unset. ConfigError names the key and the fix."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("server: must be a mapping, for example {max_body_bytes: 1048576}")
    values: dict[str, Any] = {}
    defaults = ServerSettings()
    for key, value in raw.items():
        if key not in KEYS:
            raise ConfigError(f"server.{key}: unknown setting; the server section takes "
                              f"{', '.join(KEYS)}")
        if key == "api_key":
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigError("server.api_key: expected a non-empty string (or pass "
                                  f"--api-key, or set {API_KEY_ENV})")
            values[key] = value
            continue
        if key == "allowed_x264_presets":
            values[key] = _presets(value)
            continue
        default = getattr(defaults, key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"server.{key}: expected a number, got {value!r}")
        if isinstance(default, int) and not isinstance(value, int):
            raise ConfigError(f"server.{key}: expected a whole number, got {value!r}")
        if value < _MINIMUM[key]:
            raise ConfigError(f"server.{key}: {value!r} is below the minimum {_MINIMUM[key]}")
        values[key] = value
    budget = values.get("max_client_media_bytes", defaults.max_client_media_bytes)
    per_request = values.get("max_media_bytes", defaults.max_media_bytes)
    if budget < per_request:
        raise ConfigError(f"server.max_client_media_bytes: {budget} is below server."
                          f"max_media_bytes ({per_request}), so a request's media could never "
                          "fit; raise it, or lower max_media_bytes")
    if values.get("api_key") is None and api_key_env:
        values["api_key"] = api_key_env
    return ServerSettings(**values)


def _presets(value: Any) -> tuple[str, ...]:
    """``server.allowed_x264_presets`` as x264 presets in x264's order (fastest first); a single
    name is a list of one. ConfigError names an unknown one."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise ConfigError("server.allowed_x264_presets: expected a list of x264 presets, for "
                          f"example [ultrafast, superfast, medium], got {value!r}"[:300])
    unknown = [n for n in names if n not in X264_PRESET_NAMES]
    if unknown:
        raise ConfigError(f"server.allowed_x264_presets: {unknown[0]!r} is not an x264 preset; "
                          f"x264's are {', '.join(X264_PRESET_NAMES)}"[:300])
    return tuple(n for n in X264_PRESET_NAMES if n in names)
