"""The error hierarchy of SGLang Omni.

Every refusal or failure that can reach a client is an ``OmniError`` carrying its HTTP status and
an OpenAI-style error ``type``. The HTTP layer translates them once, into
``{"error": {"message", "type", "code"}}`` (non-streaming) or an ``error`` event (streaming).
Messages tell the reader what to change.
"""

from __future__ import annotations


class OmniError(Exception):
    """Base class: ``status`` is the HTTP status, ``type`` the OpenAI error type."""

    status: int = 500
    type: str = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_body(self) -> dict:
        """The OpenAI-style error body for this error."""
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


# --- client errors -------------------------------------------------------------------------------
class BadRequest(OmniError):
    """The request is invalid; the message says which field and how to fix it."""

    status = 400
    type = "invalid_request_error"


class MediaRefused(BadRequest):
    """A media reference the media policy does not allow."""


class Unauthorized(OmniError):
    """The request lacks the server's API key (``Authorization: Bearer KEY``)."""

    status = 401
    type = "authentication_error"


class NotFound(OmniError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(OmniError):
    """The route exists but does not take this HTTP method."""

    status = 405
    type = "invalid_request_error"


class RequestTooSlow(OmniError):
    """The client took longer than the server's body timeout to send its request."""

    status = 408
    type = "invalid_request_error"


class PayloadTooLarge(OmniError):
    """The request body exceeds ``server.max_body_bytes``."""

    status = 413
    type = "invalid_request_error"


class UnsupportedMediaType(OmniError):
    """The request body is not in a format the route reads (for example not JSON)."""

    status = 415
    type = "invalid_request_error"


# --- capacity ------------------------------------------------------------------------------------
class ServiceUnavailable(OmniError):
    """The server cannot take this request now; retrying later may succeed."""

    status = 503
    type = "service_unavailable"


class StageRestarting(ServiceUnavailable):
    """A stage process is being restarted after it exited; retry shortly."""


# --- server errors -------------------------------------------------------------------------------
class ServerError(OmniError):
    """The server failed the request (a stage died, a model produced no output, a limit was hit)."""

    status = 500
    type = "server_error"


class MediaFetchFailed(OmniError):
    """Fetching remote media failed; ``status`` is 400 when the host answered 404, else 500."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status
        self.type = "invalid_request_error" if status == 400 else "server_error"


class StageDied(ServerError):
    """A stage process exited while the request was in flight."""


class RequestTimeout(ServerError):
    """The request outlived ``stages.orchestrator.factory.timeout_s``."""

    status = 504
    type = "timeout_error"


class ConfigError(Exception):
    """An invalid pipeline configuration; the message names the key and the fix."""
