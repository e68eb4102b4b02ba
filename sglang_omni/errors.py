"""The error hierarchy of SGLang Omni.

Every refusal or failure that can reach a client is an ``OmniError`` carrying its HTTP status and
an OpenAI-style error ``type``; every ``OmniError`` subclass is defined here. The type of a status
comes from :data:`ERROR_TYPES` (one map), and :meth:`OmniError.to_body` builds the one error body,
``{"error": {"message", "type", "code"}}``: the JSON answer, the SSE ``error`` event (its inner
object) and a failed video job all use it. Lower layers raise these classes and never choose an
HTTP status themselves. Messages tell the reader what to change.
"""

from __future__ import annotations

from typing import Any

#: The OpenAI error ``type`` of each HTTP status; any other 4xx is ``invalid_request_error``,
#: any other status ``server_error`` (see :func:`error_type`).
ERROR_TYPES: dict[int, str] = {400: "invalid_request_error", 401: "authentication_error",
                               404: "not_found_error", 500: "server_error",
                               503: "service_unavailable", 504: "timeout_error"}


def is_client_error(status: int) -> bool:
    """Whether ``status`` is a 4xx (the client's request is at fault)."""
    return 400 <= status < 500


def is_error_status(status: int) -> bool:
    """Whether ``status`` is an HTTP error status (4xx or 5xx)."""
    return 400 <= status < 600


def error_type(status: int) -> str:
    """The OpenAI error type of an HTTP ``status`` (:data:`ERROR_TYPES`)."""
    return ERROR_TYPES.get(status, "invalid_request_error" if is_client_error(status)
                           else "server_error")


class OmniError(Exception):
    """Base class: ``status`` is the HTTP status, ``type`` the OpenAI error type. A subclass sets
    ``status`` only; its ``type`` is ``error_type(status)``."""

    status: int = 500
    type: str = error_type(500)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "status" in cls.__dict__ and "type" not in cls.__dict__:
            cls.type = error_type(cls.status)

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_body(self) -> dict[str, dict[str, Any]]:
        """The error body, ``{"error": {"message", "type", "code"}}``; every error answer (JSON,
        SSE event, video job) is built here."""
        return {"error": {"message": self.message, "type": self.type, "code": self.status}}


# --- client errors -------------------------------------------------------------------------------
class BadRequest(OmniError):
    """The request is invalid; the message says which field and how to fix it."""

    status = 400


class MediaRefused(BadRequest):
    """A media reference the media policy does not allow."""


class Unauthorized(OmniError):
    """The request lacks the server's API key (``Authorization: Bearer KEY``)."""

    status = 401


class NotFound(OmniError):
    status = 404


class MethodNotAllowed(OmniError):
    """The route exists but does not take this HTTP method."""

    status = 405


class RequestTooSlow(OmniError):
    """The client took longer than the server's body timeout to send its request."""

    status = 408


class PayloadTooLarge(OmniError):
    """The request body exceeds ``server.max_body_bytes``."""

    status = 413


class HeadersTooLarge(OmniError):
    """The request line and headers are larger than the server reads."""

    status = 431


class UnsupportedMediaType(OmniError):
    """The request body is not in a format the route reads (for example not JSON)."""

    status = 415


# --- capacity ------------------------------------------------------------------------------------
class ServiceUnavailable(OmniError):
    """The server cannot take this request now; retrying later may succeed (the answer carries
    ``Retry-After`` when :attr:`retry_later` is true)."""

    status = 503
    #: Whether a retry of the same server may succeed (the answer then carries Retry-After).
    retry_later: bool = True
    #: Seconds until a retry can succeed when the server knows them (a stage cooling down
    #: before its restart); the answer's Retry-After is then that wait, rounded up, but never
    #: less than ``server.retry_after_s``. None: the server's ``retry_after_s``.
    retry_after_s: float | None = None


class NeedsRestart(ServiceUnavailable):
    """A stage is down for good (it exited with restarts off): this server will not come back by
    itself, so the answer carries no ``Retry-After``; retry on another server."""

    retry_later = False


class StageRestarting(ServiceUnavailable):
    """A stage process is being restarted after it exited; retry shortly (``retry_after_s``:
    the seconds until its restart, when it is cooling down)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ShuttingDown(ServiceUnavailable):
    """The server is stopping (SIGTERM or SIGINT): it takes no new request and ends those still
    running after its grace period; another server can take the request."""

    def __init__(self, message: str = "the server is shutting down; retry on another server"
                 ) -> None:
        super().__init__(message)


# --- server errors -------------------------------------------------------------------------------
class ServerError(OmniError):
    """The server failed the request (a stage died, a model produced no output, a limit was hit)."""

    status = 500


class OutOfGPUMemory(ServerError):
    """An allocation failed inside a stage's engine while it served this request (CUDA out of
    memory): the request fails at once, the stage frees what the request held and serves the
    next request without a restart. The message names the stage and what to change (a smaller
    size, fewer frames or media, or more memory for the stage)."""


class MediaFetchFailed(OmniError):
    """Fetching remote media failed on the server's side of things (the host answered an
    error, timed out, broke the connection, redirected too often or sent too much). A 404 is
    the client's doing and is :class:`MediaNotFound`, which this does not catch."""

    status = 500


class MediaNotFound(BadRequest):
    """The media host answered 404: the request names media that does not exist (a client
    error: ``except MediaFetchFailed`` does not catch it)."""


class StageCallError(OmniError):
    """A stage answered a call with an error; carries the stage's status and type."""

    def __init__(self, message: str, status: int, type_: str) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


class NativeRefusal(OmniError):
    """Native SGLang refused (``status`` 400 by default) or failed a request; carries the status
    native answered, and its type from :data:`ERROR_TYPES`."""

    def __init__(self, message: str, status: int = BadRequest.status) -> None:
        super().__init__(message)
        self.status = status
        self.type = error_type(status)


class StageDied(ServerError):
    """A stage process exited while the request was in flight."""


class RequestTimeout(ServerError):
    """The request outlived ``stages.orchestrator.factory.timeout_s``."""

    status = 504


class ConfigError(Exception):
    """An invalid pipeline configuration; the message names the key and the fix."""
