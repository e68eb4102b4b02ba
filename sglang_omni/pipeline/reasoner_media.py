"""One interleaved request's media as its Reasoner turns send them: each item once per request.

Every Reasoner turn reads the whole conversation, every media item of the request in order (the
client's chat media and every image and video generated so far). What crosses to the Reasoner
stage is less: :meth:`ReasonerMedia.prepare` turns a turn's payload into one whose media parts
all name ``omni-frame://i`` (the turn's ``job.frames``), a list of stable per-request keys for
those frames, and the bytes of only the items the stage process does not hold yet
(``runtime.request_media`` keeps them there until the request ends).

* Client media are read once, under the media policy, on the request's first turn: inline ones
  (``data:`` URLs, bare base64) decoded, remote URLs fetched, local files read. Every turn reads
  the same bytes, and no base64 travels inside a stage message header.
* Generated media are the adapter's frames: frame *N* keeps its key for the request (an
  adapter's ``frames`` list only grows, and an index always names the same bytes).
* When the stage process that holds the items is gone (it restarted mid-request), the turn fails
  with the restart path's :class:`~sglang_omni.errors.StageDied`: the request is retried whole.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sglang_omni.contract.job import FRAME_SCHEME
from sglang_omni.contract.result import Frames
from sglang_omni.errors import BadRequest, StageDied
from sglang_omni.media import MediaPolicy, RequestMediaDir, load_bytes
from sglang_omni.media.content_parts import MEDIA_PART_KINDS, iter_content_parts
from sglang_omni.runtime.stage_handle import StageHandle


@dataclass
class ReasonerCall:
    """A turn as it goes to the stage: ``payload`` (media parts name ``omni-frame://i``),
    ``media`` (``{keys, new}`` for ``StageHandle.call``) and ``frames`` (the new items' bytes)."""

    payload: dict[str, Any]
    media: dict[str, list[str]]
    frames: Frames


@dataclass
class _StageState:
    """What one stage process holds of the request: its keys, and which process it is."""

    generation: int
    held: set[str] = field(default_factory=set)


class ReasonerMedia:
    """The media of one interleaved request; :meth:`close` when the request ends."""

    def __init__(self, rid: str, policy: MediaPolicy) -> None:
        self.rid = rid
        self.policy = policy
        #: Client media references -> their key, and the bytes of those not sent yet.
        self._client_keys: dict[str, str] = {}
        self._unsent: dict[str, bytes] = {}
        self._stages: dict[str, _StageState] = {}

    async def prepare(self, handle: StageHandle, payload: Mapping[str, Any],
                      frames: Frames) -> ReasonerCall:
        """The turn ``payload`` (generated media ``frames``) as it goes to ``handle``'s stage;
        MediaRefused or MediaFetchFailed for client media that cannot be read, StageDied when
        the stage process holding the request's media is gone."""
        state = self._stages.get(handle.name)
        if state is not None and state.held and state.generation != handle.process_generation:
            raise StageDied(
                f"the {handle.name} stage process restarted while request {self.rid} was in "
                "flight, losing the media it held for the request; retry the request")
        if state is None or state.generation != handle.process_generation:
            state = self._stages[handle.name] = _StageState(handle.process_generation)
        messages = copy.copy(payload.get("messages") or [])
        keys: list[str] = []
        items: dict[str, bytes | bytearray] = {}
        offset = int(payload.get("message_offset", 0) or 0)
        # the turn's fetched and decoded bytes count against max_media_bytes, as on the stage
        with _TurnDir() as workdir:
            for part in list(iter_content_parts(messages, offset)):
                if part.kind not in MEDIA_PART_KINDS.values() or part.url is None:
                    continue
                key, data = await self._item(part.url, part.label, frames, workdir)
                url = f"{FRAME_SCHEME}{len(keys)}"
                keys.append(key)
                if key not in state.held:
                    items[key] = data
                _replace_url(messages, part.message_index + offset, part.part_index, url)
        new = list(items)
        return ReasonerCall({**payload, "messages": messages}, {"keys": keys, "new": new},
                            [items[key] for key in new])

    def sent(self, handle: StageHandle, call: ReasonerCall) -> None:
        """``call`` reached ``handle``'s stage: it holds the new items now (the server keeps
        no copy of the client's)."""
        state = self._stages.get(handle.name)
        if state is None or state.generation != handle.process_generation:
            return
        state.held.update(call.media["new"])
        for key in call.media["new"]:
            self._unsent.pop(key, None)

    async def _item(self, url: str, label: str, frames: Frames, workdir: _TurnDir
                    ) -> tuple[str, bytes | bytearray]:
        """(key, bytes) of the medium ``url`` names."""
        if url.startswith(FRAME_SCHEME):
            index = url[len(FRAME_SCHEME):]
            if not index.isdigit() or int(index) >= len(frames):
                raise BadRequest(f"{label}: {url} names no inline media of this request")
            return f"g{int(index)}", frames[int(index)]
        key = self._client_keys.get(url)
        if key is not None:
            return key, self._unsent.get(key, b"")
        data = await load_bytes(url, self.policy, workdir.get(), label=label)
        key = f"c{len(self._client_keys)}"
        self._client_keys[url] = key
        self._unsent[key] = data
        return key, data

    def close(self) -> None:
        """Drop what the request kept here; idempotent."""
        self._unsent.clear()
        self._client_keys.clear()


class _TurnDir:
    """The turn's media folder, made only when a client medium is read (most turns read
    none); removed when the ``with`` block ends."""

    def __init__(self) -> None:
        self._dir: RequestMediaDir | None = None

    def get(self) -> RequestMediaDir:
        if self._dir is None:
            self._dir = RequestMediaDir()
        return self._dir

    def __enter__(self) -> _TurnDir:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._dir is not None:
            self._dir.close()


def _replace_url(messages: list[Any], index: int, part_index: int, url: str) -> None:
    """Point part ``part_index`` of ``messages[index]`` at ``url`` (the message and part are
    copied: the caller's stay as they were)."""
    message = dict(messages[index])
    content = list(message["content"])
    part = dict(content[part_index])
    kind = part["type"]
    ref = part.get(kind)
    part[kind] = {**ref, "url": url} if isinstance(ref, Mapping) else url
    content[part_index] = part
    message["content"] = content
    messages[index] = message
