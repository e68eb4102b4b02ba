"""The media policy every route and stage applies to client-supplied media references.

* :mod:`.policy`: :class:`MediaPolicy`, the allow/refuse decision (no network I/O);
* :mod:`.content_parts`: the one walker over chat content parts (:func:`iter_content_parts`);
* :mod:`.refs`: every media reference of a chat request / generation options, with labels, and
  the request-wide pre-check (:func:`check_media_refs`: count, policy, inline bytes);
* :mod:`.fetch`: :func:`materialize` / :func:`load_bytes`, the guarded reads;
* :mod:`.verify`: whether a medium's bytes are what they claim (parsed: inline media at
  admission, remote media once fetched);
* :mod:`.resolve`, :mod:`.addresses`: resolve-once, public-address checks, pinned connections;
* :mod:`.workdir`: :class:`RequestMediaDir`, the per-request temp folder (and
  :class:`LazyMediaDir`, one made only when something is written);
* :mod:`.urls`, :mod:`.local`, :mod:`.inline`: the syntax rules for each kind of reference.
"""

from sglang_omni.media.fetch import fetch_remote, load_bytes, materialize
from sglang_omni.media.policy import (
    NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB,
    InlineMedia,
    LocalMedia,
    MediaPolicy,
    MediaSource,
    RemoteMedia,
)
from sglang_omni.media.refs import (
    check_chat_request,
    check_generation_media,
    check_media_refs,
    iter_chat_media_refs,
    iter_generation_media_refs,
)
from sglang_omni.media.workdir import LazyMediaDir, RequestMediaDir

__all__ = [
    "NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB",
    "InlineMedia",
    "LocalMedia",
    "MediaPolicy",
    "MediaSource",
    "RemoteMedia",
    "LazyMediaDir",
    "RequestMediaDir",
    "check_chat_request",
    "check_generation_media",
    "check_media_refs",
    "fetch_remote",
    "iter_chat_media_refs",
    "iter_generation_media_refs",
    "load_bytes",
    "materialize",
]
