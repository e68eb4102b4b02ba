"""The stage wire's messages: one frozen type per operation, and the one codec for them.

A message travels as a map (``runtime.ipc`` packs it with msgpack, beside its byte frames)
whose ``op`` names its type and whose other keys are its fields. :func:`encode` gives that map
(an optional field left at None is not sent); :func:`decode` gives the message back, checking
every field's type, and raises :class:`ProtocolError` naming the message type and the field
for anything it cannot accept (no map, an unknown ``op``, a missing field, a field of the wrong
type), never a KeyError or TypeError. Keys a type does not declare are ignored (a field added
later reaches an older peer harmlessly): the wire grows by adding fields, never renaming them.

Server -> stage: :class:`Submit`, :class:`Abort`, :class:`End`, :class:`Ping`,
:class:`Shutdown`. Stage -> server: :class:`Ready`, :class:`Failed`, :class:`Pong`,
:class:`Started`, :class:`Chunk`, :class:`Progress`, :class:`Result`, :class:`Error`,
:class:`Aborted`, :class:`Fatal`. What each means: ``runtime.stage.process``'s module contract.
"""

from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, TypeAlias, Union, get_args, get_origin, get_type_hints

from sglang_omni.errors import ServerError

Json: TypeAlias = dict[str, Any]


class ProtocolError(ValueError):
    """A message that is not one of :data:`MESSAGES`: ``message_type`` is its ``op`` (None
    when even that is unreadable), ``field`` the field at fault (``op`` for an unknown type)."""

    def __init__(self, message_type: str | None, field: str, detail: str) -> None:
        where = f"{message_type}.{field}" if message_type else field
        super().__init__(f"stage protocol error: {where}: {detail}")
        self.message_type = message_type
        self.field = field
        self.detail = detail


# --- server -> stage ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Run ``payload`` (and the message's frames) as job ``token`` of request ``rid``.
    ``order``: the request's admission time on the server's monotonic clock; ``media``:
    ``{keys, new}`` (``runtime.request_media``); ``wire_error``: set by the receiving end when
    a base64 frame was not strict base64 (``runtime.ipc``)."""

    op: ClassVar[str] = "submit"
    rid: str
    token: int
    payload: Json
    order: float | None = None
    media: dict[str, list[str]] | None = None
    wire_error: str | None = None


@dataclass(frozen=True, slots=True)
class Abort:
    op: ClassVar[str] = "abort"
    rid: str


@dataclass(frozen=True, slots=True)
class End:
    """Request ``rid`` ended: the stage drops what it keeps for it."""

    op: ClassVar[str] = "end"
    rid: str


@dataclass(frozen=True, slots=True)
class Ping:
    op: ClassVar[str] = "ping"
    seq: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    op: ClassVar[str] = "shutdown"


# --- stage -> server ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    op: ClassVar[str] = "ready"
    pid: int
    stops_server_on_exit: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    """The stage failed to start."""

    op: ClassVar[str] = "failed"
    message: str


@dataclass(frozen=True, slots=True)
class Fatal:
    """The engine can no longer serve; the stage exits."""

    op: ClassVar[str] = "fatal"
    message: str


@dataclass(frozen=True, slots=True)
class Pong:
    """A heartbeat answer (``seq`` None: sent unasked while a long message arrives)."""

    op: ClassVar[str] = "pong"
    seq: int | None
    media: Json
    request_media: Json
    gpu: Json | None = None
    engine: Json | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """The stage's engine took job ``token`` of ``rid`` (a generation job once its GPU turn
    came)."""

    op: ClassVar[str] = "started"
    rid: str
    token: int


@dataclass(frozen=True, slots=True)
class Chunk:
    op: ClassVar[str] = "chunk"
    rid: str
    token: int
    data: Json


@dataclass(frozen=True, slots=True)
class Progress:
    op: ClassVar[str] = "progress"
    rid: str
    token: int


@dataclass(frozen=True, slots=True)
class Result:
    op: ClassVar[str] = "result"
    rid: str
    token: int
    payload: Json
    engine_s: float = 0.0
    spans: Json | None = None


@dataclass(frozen=True, slots=True)
class Error:
    op: ClassVar[str] = "error"
    rid: str
    token: int
    message: str
    status: int = ServerError.status
    type: str = ServerError.type


@dataclass(frozen=True, slots=True)
class Aborted:
    op: ClassVar[str] = "aborted"
    rid: str
    token: int


ToStage: TypeAlias = Submit | Abort | End | Ping | Shutdown
ToServer: TypeAlias = (Ready | Failed | Fatal | Pong | Started | Chunk | Progress | Result | Error
                      | Aborted)
Message: TypeAlias = ToStage | ToServer
_TO_STAGE = (Submit, Abort, End, Ping, Shutdown)
#: The job messages that end a job on the stage.
JOB_ENDS: tuple[type, ...] = (Result, Error, Aborted)
JOB_END_OPS = frozenset({Result.op, Error.op, Aborted.op})


# --- the codec ------------------------------------------------------------------------------------
_PLAIN = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "map",
          list: "list", type(None): "null"}


def _names(kind: Any, plural: bool = False) -> str:
    """How an error names values of ``kind``: ``a map of lists of strings or null``."""
    if get_origin(kind) is Union or type(kind).__name__ == "UnionType":
        return " or ".join(_names(k, plural) for k in get_args(kind))
    base, args = get_origin(kind) or kind, get_args(kind)
    noun = _PLAIN.get(base, str(base))
    if base is type(None):
        return noun
    noun = noun + "s" if plural else ("an " if noun[0] in "aeiou" else "a ") + noun
    if base is dict and args and args[1] is not Any:
        noun += " of " + _names(args[1], True)
    elif base is list and args:
        noun += " of " + _names(args[0], True)
    return noun


def _checker(kind: Any) -> Any:
    """A predicate for values of ``kind`` (the annotations this module uses)."""
    if get_origin(kind) is Union or type(kind).__name__ == "UnionType":
        parts = [_checker(k) for k in get_args(kind)]
        if len(parts) == 2:  # X | None, the common case: no generator per value
            one, two = parts
            return lambda v: one(v) or two(v)
        return lambda v: any(p(v) for p in parts)
    if kind is type(None):
        return lambda v: v is None
    if kind is bool:
        return lambda v: isinstance(v, bool)
    if kind is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if kind is float:
        return lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if kind is str:
        return lambda v: isinstance(v, str)
    if get_origin(kind) is dict:
        value_kind = get_args(kind)[1]
        if value_kind is Any:
            return lambda v: isinstance(v, dict)
        check = _checker(value_kind)
        return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())
    if get_origin(kind) is list:
        check = _checker(get_args(kind)[0])
        return lambda v: isinstance(v, list) and all(check(x) for x in v)
    raise TypeError(f"no wire check for {kind!r}")


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    #: The exact type a value of this field has on the wire when nothing is odd (its check
    #: is then skipped); None where the check must always run (a map of lists, ...).
    fast: type | None
    check: Any
    expect: str
    required: bool
    default: Any


def _fast_type(kind: Any) -> type | None:
    if get_origin(kind) is Union or type(kind).__name__ == "UnionType":
        kinds = [k for k in get_args(kind) if k is not type(None)]
        return _fast_type(kinds[0]) if len(kinds) == 1 else None
    if kind in (str, int, float, bool):
        return kind
    if get_origin(kind) is dict and get_args(kind)[1] is Any:
        return dict
    return None


def _spec(cls: type) -> tuple[_Field, ...]:
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        kind = hints[f.name]
        out.append(_Field(f.name, _fast_type(kind), _checker(kind), _names(kind),
                          f.default is MISSING, f.default))
    return tuple(out)


#: Every message type by its ``op``.
MESSAGES: dict[str, type] = {cls.op: cls for cls in (
    Submit, Abort, End, Ping, Shutdown, Ready, Failed, Fatal, Pong, Started, Chunk, Progress,
    Result, Error, Aborted)}
_SPECS: dict[type, tuple[_Field, ...]] = {cls: _spec(cls) for cls in MESSAGES.values()}


def encode(message: Message) -> Json:
    """The wire map of ``message``: its ``op`` and its fields (optional ones left at None
    omitted)."""
    out: Json = {"op": message.op}
    for f in _SPECS[type(message)]:
        value = getattr(message, f.name)
        if value is not None or f.required:
            out[f.name] = value
    return out


def decode(header: Any) -> Message:
    """The message a wire map holds; ProtocolError naming the type and field otherwise."""
    if not isinstance(header, dict):
        raise ProtocolError(None, "(message)", f"expected a map, got {type(header).__name__}")
    op = header.get("op")
    cls = MESSAGES.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(None, "op", f"{op!r} is not a message type; expected one of "
                                        f"{', '.join(sorted(MESSAGES))}")
    values = []
    for f in _SPECS[cls]:
        value = header.get(f.name, _ABSENT)
        if type(value) is not f.fast:  # the common case skips the check
            value = _checked(op, f, value)
        values.append(value)
    return cls(*values)


_ABSENT = object()


def _checked(op: str | None, f: _Field, value: Any) -> Any:
    """``value`` of field ``f`` as the message holds it (its default where it is absent or an
    optional one is null); ProtocolError when it cannot be."""
    if value is _ABSENT:
        if f.required:
            raise ProtocolError(op, f.name, "missing")
        return f.default
    if value is None and not f.required:
        return f.default  # an optional field sent as null: its default
    if not f.check(value):
        raise ProtocolError(op, f.name, f"expected {f.expect}, got {type(value).__name__}")
    return value


def decode_to_stage(header: Any) -> ToStage:
    """:func:`decode` for the stage's end: ProtocolError for a type the server never sends."""
    message = decode(header)
    if not isinstance(message, _TO_STAGE):
        raise ProtocolError(message.op, "op", f"{message.op!r} is not a message a stage is sent")
    return message


def decode_to_server(header: Any) -> ToServer:
    """:func:`decode` for the server's end: ProtocolError for a type a stage never sends."""
    message = decode(header)
    if isinstance(message, _TO_STAGE):
        raise ProtocolError(message.op, "op", f"{message.op!r} is not a message a stage sends")
    return message


def job_of(header: Any) -> tuple[str, int] | None:
    """The (rid, token) a message that failed to decode still names plainly, if any: what
    its receiver can fail instead of leaving the job waiting."""
    if isinstance(header, dict):
        rid, token = header.get("rid"), header.get("token")
        if isinstance(rid, str) and isinstance(token, int) and not isinstance(token, bool):
            return rid, token
    return None
