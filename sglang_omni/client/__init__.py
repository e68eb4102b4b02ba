"""The SGLang Omni SDK: ``Client`` talks to a running server over HTTP."""

from sglang_omni.client.client import Client
from sglang_omni.client.types import (
    MediaData,
    OmniClientError,
    Segment,
    UMMCompletionResult,
    UMMGenerateChunk,
)

__all__ = ["Client", "MediaData", "OmniClientError", "Segment", "UMMCompletionResult",
           "UMMGenerateChunk"]
