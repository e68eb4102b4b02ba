"""The one walker over OpenAI chat content parts.

A message's ``content`` is a string or a list of parts: ``{"type": "text", "text": ...}`` or a
media part ``{"type": "image_url" | "video_url" | "audio_url", <type>: "url" | {"url": ...}}``.
:func:`message_parts` yields the parts of one message's content, :func:`iter_content_parts` those
of a whole conversation, each as a :class:`ContentPart` that knows its label
(``messages[i].content[j]``), its kind by ``type``, and its text or media url. Walking is
lenient (a string content has no parts, a message or part that is not an object is passed over
or handed on as it is); checking shapes is the caller's rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Media part types and the kind of medium each carries.
MEDIA_PART_KINDS: dict[str, str] = {"image_url": "image", "video_url": "video",
                                    "audio_url": "audio"}
#: Chat content part keys that carry a media URL (as a string or ``{"url": ...}``).
CHAT_MEDIA_PART_KEYS = tuple(MEDIA_PART_KINDS)
#: The key of a media part Omni made from a request's top-level ``images``/``videos`` list:
#: where the client put the reference (``images[0]``), so errors name it as sent. Engines that
#: hand parts to native SGLang leave it out (:func:`without_client_label`).
CLIENT_LABEL_KEY = "omni_client_label"


@dataclass(frozen=True)
class ContentPart:
    """Part ``part_index`` of message ``message_index``'s list content; ``part`` is the raw
    value (an object in a well-formed request)."""

    message_index: int
    part_index: int
    part: Any

    @property
    def client_label(self) -> str | None:
        """Where the client put a part Omni moved into the messages (``images[0]``), or None."""
        label = self.part.get(CLIENT_LABEL_KEY) if isinstance(self.part, Mapping) else None
        return label if isinstance(label, str) else None

    @property
    def where(self) -> str:
        """``messages[i].content[j]``, the part's place in the request (or the client's place
        for a part of a top-level media list)."""
        return self.client_label or f"messages[{self.message_index}].content[{self.part_index}]"

    @property
    def type(self) -> str | None:
        """The part's ``type`` string; None when it has none or is not an object."""
        kind = self.part.get("type") if isinstance(self.part, Mapping) else None
        return kind if isinstance(kind, str) else None

    @property
    def kind(self) -> str | None:
        """``text``, ``image``, ``video`` or ``audio`` by ``type``; None for any other part."""
        if self.type == "text":
            return "text"
        return MEDIA_PART_KINDS.get(self.type or "")

    @property
    def label(self) -> str:
        """Where a media part's reference sits: ``messages[i].content[j].<type>``, or as the
        client sent it (``images[0]``)."""
        return self.client_label or f"{self.where}.{self.type}"

    @property
    def ref(self) -> Any:
        """A media part's reference value (``"url"`` or ``{"url": ...}``); None if absent."""
        return self.part.get(self.type) if self.type in MEDIA_PART_KINDS else None

    @property
    def url(self) -> str | None:
        """A media part's url, from ``"url"`` or ``{"url": "url"}``; None when it is not a
        string (or the part is no media part)."""
        ref = self.ref
        url = ref.get("url") if isinstance(ref, Mapping) else ref
        return url if isinstance(url, str) else None

    @property
    def text(self) -> str:
        """A text part's text ("" for other parts)."""
        return str(self.part.get("text", "")) if self.kind == "text" else ""


def without_client_label(part: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``part`` without Omni's :data:`CLIENT_LABEL_KEY`."""
    return {k: v for k, v in part.items() if k != CLIENT_LABEL_KEY}


def message_parts(message_index: int, content: Any) -> Iterator[ContentPart]:
    """Every part of one message's ``content``, in order; none when it is not a list."""
    if isinstance(content, list):
        for j, part in enumerate(content):
            yield ContentPart(message_index, j, part)


def iter_content_parts(messages: Any, offset: int = 0) -> Iterator[ContentPart]:
    """Every part of every message's list content, in conversation order; messages that are
    not objects are passed over. ``offset``: messages put before the client's, so labels name
    the client's index (``messages[i - offset]``)."""
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        if isinstance(message, Mapping):
            yield from message_parts(i - offset, message.get("content"))


def text_of(content: Any, sep: str = "") -> str:
    """A content's text: the string itself, or its text parts joined by ``sep``."""
    if isinstance(content, str):
        return content
    return sep.join(p.text for p in message_parts(0, content) if p.kind == "text")
