"""Whether joining a Ray cluster would fail on its token authentication, asked at once.

Ray 2.60 turns token authentication on for a cluster started where a token exists
(``~/.ray/auth_token``, which a local ``ray.init()`` writes; or ``RAY_AUTH_MODE=token``), but a
process joining by an explicit address (``--ray-address HOST:6379``) sends its token only when
``RAY_AUTH_MODE=token`` is set in its environment. Without it ``ray.init`` retries the refused
connection for 20 s and then reports only that it could not connect. :func:`check_token_auth`
asks the cluster's GCS once (one RPC, a few milliseconds) and raises :class:`RayAuthRequired`,
which says what to set, before ``ray.init`` is called.
"""

from __future__ import annotations

import os

#: Seconds the one probe RPC may take (an unreachable address is left to ``ray.init``).
PROBE_TIMEOUT_S = 5.0


class RayAuthRequired(Exception):  # noqa: N818 - what the cluster answered
    """The cluster wants a token this process would not send."""


def auth_message(address: str) -> str:
    return (f"the Ray cluster at {address} requires token authentication (Ray turns it on for "
            "a cluster started where a token exists, e.g. ~/.ray/auth_token) and this process "
            "would connect without a token: set RAY_AUTH_MODE=token here, with the cluster's "
            "token in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN (`ray "
            "get-auth-token` on the head host prints it); or start the cluster with "
            "RAY_AUTH_MODE=disabled on every host (only on a trusted network)")


def check_token_auth(address: str | None) -> None:
    """Raise RayAuthRequired when the GCS at ``address`` (``HOST:PORT``) refuses this process's
    connection for want of a token. Nothing is asked for a local instance (None), ``auto``
    (Ray finds the token itself), a Ray client address (``ray://``) or when
    ``RAY_AUTH_MODE=token`` is set (Ray sends the token); any other failure is left to
    ``ray.init``, which reports it."""
    if (address is None or address == "auto" or "://" in address
            or os.environ.get("RAY_AUTH_MODE", "").lower() == "token"):
        return
    import grpc  # type: ignore[import-untyped]  # grpcio ships no stubs
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(address)
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]  # generated
            timeout=PROBE_TIMEOUT_S)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise RayAuthRequired(auth_message(address)) from None
    finally:
        channel.close()
