"""The uvicorn internals the server's protocol subclasses rely on are still there.

``serve/protocol/connection.py`` (``GuardedH11Protocol``, ``BoundedFlow``) and
``serve/protocol/ws_protocol.py``
(``BudgetedWebSocketProtocol``) subclass uvicorn's private protocol classes, and
``serve/ops/shutdown.py``'s ``DrainingServer`` its server (its ``capture_signals`` clears the
signals uvicorn would raise again): uvicorn has no
public hook for header, body or send deadlines or for counting a WebSocket's buffered bytes. A
uvicorn release that renames a method or attribute they use would otherwise break the hardening
quietly (an override never called, a ``getattr`` default read). This reads each subclass's code
and checks that every method it overrides exists on uvicorn's class with the same parameters,
and that every ``self.<name>`` it uses and does not set itself is set or defined by uvicorn's
class. The behaviours themselves are pinned by tests/wire/test_connections.py, test_ws_budget.py
and tests/generation/test_realtime_ws.py.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from sglang_omni.serve.ops.shutdown import DrainingServer
from sglang_omni.serve.protocol.connection import BoundedFlow, GuardedH11Protocol
from sglang_omni.serve.protocol.ws_protocol import BudgetedWebSocketProtocol


def class_tree(cls: type) -> ast.ClassDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = tree.body[0]
    assert isinstance(node, ast.ClassDef)
    return node


def attributes(cls: type) -> tuple[set[str], set[str]]:
    """The ``self.<name>`` attributes ``cls``'s own code reads and those it assigns."""
    used: set[str] = set()
    assigned: set[str] = set()
    for node in ast.walk(class_tree(cls)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            (assigned if isinstance(node.ctx, ast.Store) else used).add(node.attr)
    return used, assigned


def provided_by(base: type) -> set[str]:
    """What ``base`` (and its uvicorn bases) define or assign on ``self``."""
    names: set[str] = set()
    for klass in base.__mro__:
        if klass is object:
            continue
        names.update(vars(klass))
        try:
            names.update(attributes(klass)[1])
        except (OSError, TypeError):  # a class without source (builtin, C extension)
            pass
    return names


CASES = [(GuardedH11Protocol, H11Protocol), (BoundedFlow, FlowControl),
         (BudgetedWebSocketProtocol, WebSocketsSansIOProtocol), (DrainingServer, uvicorn.Server)]


#: Public methods of ours that uvicorn does not have (every other public one overrides uvicorn's).
OUR_OWN = {"buffered_bytes"}


@pytest.mark.parametrize(("ours", "base"), CASES, ids=lambda c: c.__name__)
def test_every_overridden_method_is_uvicorns_with_the_same_parameters(ours: type,
                                                                      base: type) -> None:
    for name, member in vars(ours).items():
        if not inspect.isfunction(member) or name in OUR_OWN:
            continue
        if name.startswith("_") and name != "__init__":
            assert not hasattr(base, name), f"{ours.__name__}.{name} shadows uvicorn's {name}"
            continue
        assert hasattr(base, name), f"uvicorn's {base.__name__} has no {name}() to override"
        theirs = list(inspect.signature(getattr(base, name)).parameters)
        mine = list(inspect.signature(member).parameters)
        if mine[1:] != ["args", "kwargs"]:  # else ours passes everything on
            assert mine[:len(theirs)] == theirs, f"{base.__name__}.{name}{theirs}, ours {mine}"


@pytest.mark.parametrize(("ours", "base"), CASES, ids=lambda c: c.__name__)
def test_every_attribute_used_is_uvicorns_or_ours(ours: type, base: type) -> None:
    used, assigned = attributes(ours)
    own = assigned | set(vars(ours)) | set(getattr(ours, "__annotations__", {}))
    missing = sorted(used - own - provided_by(base))
    assert not missing, f"uvicorn's {base.__name__} no longer sets {missing}"


def test_the_websocket_connection_fields_read_are_the_websockets_librarys() -> None:
    """``buffered_bytes`` reads the sans-I/O connection's reader buffer, ``data_received`` its
    ``handshake_exc``: if they vanish the budget would count nothing."""
    from websockets.server import ServerProtocol

    connection = ServerProtocol()
    assert isinstance(connection.reader.buffer, bytearray | bytes)
    assert hasattr(connection, "handshake_exc")
    assert callable(connection.data_to_send) and callable(connection.send_close)
