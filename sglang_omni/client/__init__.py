"""The SGLang Omni SDK: ``Client`` talks to a running server over HTTP."""

from sglang_omni.client.client import Client
from sglang_omni.client.realtime import RealtimeActions, RealtimeVideo, VideoChunk
from sglang_omni.client.types import (
    GenerationCancelled,
    MediaData,
    OmniClientError,
    Segment,
    UMMCompletionResult,
    UMMGenerateChunk,
)

__all__ = ["Client", "GenerationCancelled", "MediaData", "OmniClientError", "RealtimeActions",
           "RealtimeVideo", "Segment", "UMMCompletionResult", "UMMGenerateChunk", "VideoChunk"]
