"""Finding every media reference a request carries, so each can be checked before model work.

Labels name where a reference sits in the request (``messages[0].content[1].image_url``,
``images[2]``, ``image_path``) and appear in refusal messages.

:func:`check_media_refs` is the one pre-check every route runs over all of a request's references
at once: their number against ``max_media_parts``, each against the policy, and the decoded size
of inline data, all parts together, against ``max_media_bytes`` (bytes fetched from remote hosts
are counted by the fetch itself). Every refusal is a 400 before any model work.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping

from sglang_omni.errors import BadRequest, MediaRefused
from sglang_omni.media.content_parts import CHAT_MEDIA_PART_KEYS, iter_content_parts
from sglang_omni.media.policy import MEDIA_BYTES_FLAG, MEDIA_PARTS_FLAG, InlineMedia, MediaPolicy
from sglang_omni.media.stats import MEDIA_STATS

#: Top-level request lists of media references.
TOP_LEVEL_MEDIA_LISTS = ("images", "videos", "audios")
#: Generation option keys that name media (a string or a list of strings).
GENERATION_MEDIA_KEYS = ("image_path", "video_path")


def _url_of(value: object, label: str) -> tuple[str, str]:
    """The reference inside a ``"..."`` or ``{"url": "..."}`` value, with its label."""
    if isinstance(value, Mapping):
        value, label = value.get("url"), f"{label}.url"
    if not isinstance(value, str):
        raise BadRequest(f"{label} must be a URL string")
    return label, value


def iter_chat_media_refs(body: Mapping) -> Iterator[tuple[str, str]]:
    """Yield ``(label, ref)`` for every media reference of an OpenAI chat request body.

    Covers ``messages[*].content[*]`` parts holding ``image_url``/``video_url``/``audio_url``
    (whatever their ``type`` says) and the top-level ``images``/``videos``/``audios`` lists.
    A media field that is not a string (or ``{"url": string}``) raises :class:`BadRequest`;
    other malformed structure is left to request validation.
    """
    for part in iter_content_parts(body.get("messages")):
        if not isinstance(part.part, Mapping):
            continue
        for key in CHAT_MEDIA_PART_KEYS:  # every media key, so a mislabelled part is checked too
            if key in part.part:
                yield _url_of(part.part[key], f"{part.where}.{key}")
    for key in TOP_LEVEL_MEDIA_LISTS:
        if body.get(key) is None:
            continue
        items = body[key]
        if not isinstance(items, list):
            raise BadRequest(f"{key} must be a list of media URLs")
        for k, item in enumerate(items):
            yield _url_of(item, f"{key}[{k}]")


def iter_generation_media_refs(options: Mapping, *, prefix: str = "") -> Iterator[tuple[str, str]]:
    """Yield ``(label, ref)`` for the ``image_path``/``video_path`` options (string or list)."""
    for key in GENERATION_MEDIA_KEYS:
        value = options.get(key)
        if value is None:
            continue
        label = f"{prefix}{key}"
        if isinstance(value, list | tuple):
            for k, item in enumerate(value):
                yield _url_of(item, f"{label}[{k}]")
        else:
            yield _url_of(value, label)


def _size(exc: MediaRefused) -> MediaRefused:
    setattr(exc, "media_reason", "size")  # noqa: B010 - read by check_media_refs
    return exc


def check_media_refs(refs: Iterable[tuple[str, str]], policy: MediaPolicy, *,
                     inline_images: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """Refuse (400) a request whose ``(label, ref)`` references break ``policy``; the
    references checked (for :func:`~sglang_omni.media.admission.admit_media`).

    In order: more references than ``max_media_parts``; any reference the policy refuses;
    inline data whose decoded sizes add up to more than ``max_media_bytes``. ``inline_images``:
    ``(label, text)`` of images sent inline outside a reference (the action route's
    ``{"b64_json": ...}``), each one media item of ``max_media_parts``, held to the same
    per-file limit and counted in the same ``max_media_bytes`` as inline references. No
    network I/O.
    """
    checked = list(refs)
    try:
        _check_media_refs(checked, policy, list(inline_images))
    except MediaRefused as exc:
        MEDIA_STATS.refused(getattr(exc, "media_reason", "policy"))
        raise
    return checked


def _check_media_refs(refs: list[tuple[str, str]], policy: MediaPolicy,
                      inline_images: list[tuple[str, str]]) -> None:
    limit = policy.max_media_parts
    labels = [label for label, _ in refs] + [label for label, _ in inline_images]
    if limit is not None and len(labels) > limit:
        raise _size(MediaRefused(
            f"{labels[limit]}: the request carries {len(labels)} media references, more than "
            f"the limit of {limit} ({MEDIA_PARTS_FLAG} {limit}); send at most {limit} images, "
            "videos and audios per request, or raise the limit"
        ))
    inline_bytes = 0
    sources = itertools.chain(  # one at a time: the first broken rule is the one reported
        ((label, policy.resolve(ref, label=label)) for label, ref in refs),
        ((label, policy.resolve_inline(text, label=label)) for label, text in inline_images))
    for label, source in sources:
        if isinstance(source, InlineMedia):
            inline_bytes += source.payload.decoded_size
            byte_limit = policy.max_media_bytes
            if byte_limit is not None and inline_bytes > byte_limit:
                raise _size(MediaRefused(
                    f"{label}: the request's inline media add up to more than {byte_limit} "
                    f"bytes ({MEDIA_BYTES_FLAG} {byte_limit}); send fewer or smaller media, "
                    "or raise the limit"
                ))


def _stage_generation_refs(body: Mapping) -> Iterator[tuple[str, str]]:
    """The string ``image_path``/``video_path`` of ``stage_params.generation`` (others are left
    to the stage's own option checks)."""
    stage_params = body.get("stage_params")
    generation = stage_params.get("generation") if isinstance(stage_params, Mapping) else None
    if not isinstance(generation, Mapping):
        return
    for key in GENERATION_MEDIA_KEYS:
        value = generation.get(key)
        items = value if isinstance(value, list) else [value]
        for k, item in enumerate(items):
            if isinstance(item, str):
                suffix = f"[{k}]" if isinstance(value, list) else ""
                yield f"stage_params.generation.{key}{suffix}", item


def check_chat_request(body: Mapping, policy: MediaPolicy) -> list[tuple[str, str]]:
    """Refuse (400) a chat request carrying any media reference ``policy`` does not allow, or
    more media than its limits (``stage_params.generation`` media paths count too); the
    references checked."""
    refs = list(iter_chat_media_refs(body))
    return check_media_refs([*refs, *_stage_generation_refs(body)], policy)


def check_generation_media(options: Mapping, policy: MediaPolicy, *, prefix: str = ""
                             ) -> list[tuple[str, str]]:
    """Refuse (400) generation options naming any media ``policy`` does not allow, or more
    media than its limits; the references checked."""
    return check_media_refs(iter_generation_media_refs(options, prefix=prefix), policy)
