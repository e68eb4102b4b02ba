"""One interleaved request's media as its Reasoner turns send them: each item once per request.

Every Reasoner turn reads the whole conversation, every media item of the request in order (the
client's chat media and every image and video generated so far). What crosses to the Reasoner
stage is less: :meth:`ReasonerMedia.prepare` points the media parts of the turn's payload (the
adapter's own, built once: the controller owns a dispatch's payload once the adapter returned
it) at ``omni-frame://i`` (the turn's ``job.frames``), and gives a list of stable per-request
keys for those frames and the bytes of only the items the stage process does not hold yet
(``runtime.request_media`` keeps them there until the request ends).

* Client media are read once, under the media policy, on the request's first turn: remote URLs
  fetched, local files read, a few at a time and all within the request's media deadline
  (:func:`~sglang_omni.media.gather.read_all`). Inline ones (``data:`` URLs, bare base64) are
  checked (size, strict base64) but not decoded here: they go to the stage as the client's
  base64 text, which the stage decodes as it arrives (``runtime.ipc``), so the server holds no
  decoded copy beside the request's text (a 150 MB body took 2.08x its size, issue 33). Every
  turn reads the same bytes, and no base64 travels inside a stage message header. Their
  (decoded) size settles the request's reservation in the server's client media budget
  (:mod:`~sglang_omni.pipeline.admission.media_budget`), released when the request is answered
  or ends.
* Generated media are the adapter's frames: frame *N* keeps its key for the request (an
  adapter's ``frames`` list only grows, and an index always names the same bytes).
* When the stage process that holds the items is gone (it restarted mid-request), the turn fails
  with the restart path's :class:`~sglang_omni.errors.StageDied`: the request is retried whole.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.contract.job import FRAME_SCHEME
from sglang_omni.contract.result import Frames
from sglang_omni.errors import BadRequest, StageDied
from sglang_omni.media import LazyMediaDir, MediaPolicy
from sglang_omni.media.content_parts import MEDIA_PART_KINDS, iter_content_parts
from sglang_omni.media.gather import read_all
from sglang_omni.media.inline import InlinePayload
from sglang_omni.pipeline.admission.media_budget import MediaReservation
from sglang_omni.runtime.ipc import WireFrame
from sglang_omni.runtime.stage.handle import StageHandle


@dataclass
class ReasonerCall:
    """A turn as it goes to the stage: ``payload`` (the adapter's payload itself, its media
    parts pointed at ``omni-frame://i``), ``media`` (``{keys, new}`` for ``StageHandle.call``)
    and ``frames`` (the new items: bytes, or a client's inline medium as its base64 payload,
    decoded by the stage)."""

    payload: Mapping[str, Any]
    media: dict[str, list[str]]
    frames: list[WireFrame]


@dataclass
class _StageState:
    """What one stage process holds of the request: its keys, and which process it is."""

    generation: int
    held: set[str] = field(default_factory=set)


class ReasonerMedia:
    """The media of one interleaved request; :meth:`close` when the request ends."""

    def __init__(self, rid: str, policy: MediaPolicy,
                 reservation: MediaReservation | None = None, also_held: int = 0) -> None:
        self.rid = rid
        self.policy = policy
        #: The request's place in the server's client media budget: settled to the bytes read
        #: once the client media are in (plus ``also_held``: what other stages may read for
        #: the request, its generations' image_path/video_path), released by :meth:`close`.
        self.reservation = reservation
        self._also_held = also_held
        #: Client media references -> their key, and the bytes of those not sent yet.
        self._client_keys: dict[str, str] = {}
        self._unsent: dict[str, WireFrame] = {}
        self._client_bytes = 0
        #: Seconds of the request's media deadline (``request_deadline_s``) left.
        self._fetch_left_s = policy.request_deadline_s
        self._stages: dict[str, _StageState] = {}

    async def prepare(self, handle: StageHandle, payload: Mapping[str, Any],
                      frames: Frames) -> ReasonerCall:
        """The turn ``payload`` (generated media ``frames``) as it goes to ``handle``'s stage:
        the payload's media parts are pointed at the turn's frames in place (each part replaced
        by a copy: the dicts the adapter keeps are left as they were); MediaRefused or
        MediaFetchFailed for client media that cannot be read (the client media not read yet
        are read at once, a few at a time, within the request's media deadline), StageDied when
        the stage process holding the request's media is gone."""
        state = self._stages.get(handle.name)
        if state is not None and state.held and state.generation != handle.process_generation:
            raise StageDied(
                f"the {handle.name} stage process restarted while request {self.rid} was in "
                "flight, losing the media it held for the request; retry the request")
        if state is None or state.generation != handle.process_generation:
            state = self._stages[handle.name] = _StageState(handle.process_generation)
        messages = payload.get("messages")
        if not isinstance(messages, list):
            messages = []
        offset = int(payload.get("message_offset", 0) or 0)
        parts = [part for part in iter_content_parts(messages, offset)
                 if part.kind in MEDIA_PART_KINDS.values() and part.url is not None]
        await self._read_client_media([(part.label, part.url) for part in parts
                                       if part.url is not None
                                       and not part.url.startswith(FRAME_SCHEME)])
        keys: list[str] = []
        items: dict[str, WireFrame] = {}
        for part in parts:
            assert part.url is not None
            key, data = self._item(part.url, part.label, frames)
            url = f"{FRAME_SCHEME}{len(keys)}"
            keys.append(key)
            if key not in state.held:
                items[key] = data
            _replace_url(messages, part.message_index + offset, part.part_index, url)
        new = list(items)
        return ReasonerCall(payload, {"keys": keys, "new": new}, [items[key] for key in new])

    async def _read_client_media(self, refs: list[tuple[str, str]]) -> None:
        """Read the client media of ``refs`` not read yet (each once), concurrently, within
        what is left of the request's media deadline; settle the reservation to their size.
        The fetched bytes and the inline media's decoded size count against max_media_bytes,
        as on the stage."""
        unread: dict[str, str] = {}
        for label, url in refs:
            if url not in self._client_keys:
                unread.setdefault(url, label)
        if not unread:
            return
        started = time.monotonic()
        try:
            with LazyMediaDir() as workdir:  # made only when a medium is fetched
                data = await read_all([(label, url) for url, label in unread.items()],
                                      self.policy, workdir.get(),
                                      deadline_s=max(self._fetch_left_s, 0.001))
        finally:
            self._fetch_left_s -= time.monotonic() - started
        for url, item in zip(unread, data, strict=True):
            key = f"c{len(self._client_keys)}"
            self._client_keys[url] = key
            self._unsent[key] = item
            self._client_bytes += item.decoded_size if isinstance(item, InlinePayload) \
                else len(item)
        if self.reservation is not None:
            self.reservation.settle(self._client_bytes + self._also_held)

    def sent(self, handle: StageHandle, call: ReasonerCall) -> None:
        """``call`` reached ``handle``'s stage: it holds the new items now (the server keeps
        no copy of the client's)."""
        state = self._stages.get(handle.name)
        if state is None or state.generation != handle.process_generation:
            return
        state.held.update(call.media["new"])
        for key in call.media["new"]:
            self._unsent.pop(key, None)

    def _item(self, url: str, label: str, frames: Frames) -> tuple[str, WireFrame]:
        """(key, bytes) of the medium ``url`` names (client media were read already)."""
        if url.startswith(FRAME_SCHEME):
            index = url[len(FRAME_SCHEME):]
            if not index.isdigit() or int(index) >= len(frames):
                raise BadRequest(f"{label}: {url} names no inline media of this request")
            return f"g{int(index)}", frames[int(index)]
        key = self._client_keys[url]
        return key, self._unsent.get(key, b"")

    def close(self) -> None:
        """Drop what the request kept here and release its budget reservation; idempotent."""
        self._unsent.clear()
        self._client_keys.clear()
        if self.reservation is not None:
            self.reservation.release()


def _replace_url(messages: list[Any], index: int, part_index: int, url: str) -> None:
    """Point part ``part_index`` of ``messages[index]`` at ``url``: the list entry is replaced
    by a copy of the message with a copy of the part (the message and part dicts stay as they
    were)."""
    message = dict(messages[index])
    content = list(message["content"])
    part = dict(content[part_index])
    kind = part["type"]
    ref = part.get(kind)
    part[kind] = {**ref, "url": url} if isinstance(ref, Mapping) else url
    content[part_index] = part
    message["content"] = content
    messages[index] = message
