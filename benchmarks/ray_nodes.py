"""A local Ray cluster of several nodes on this one machine, and the death of a whole node.

:class:`LocalNodes` starts a head node (``ray.cluster_utils.Cluster``: a GCS, a raylet and
its agents, as ``ray start --head`` does) that holds the custom resource :data:`HEAD` (so an
actor that asks for a sliver of it runs on the head: :func:`on_head`), and worker nodes (a
raylet each, as ``ray start --address`` does), each a separate set of processes with its own
node id. :meth:`LocalNodes.kill` kills a worker node as a power cut would: every process of
the node (its raylet, the raylet's agents and workers, and everything they started: a Serve
replica's stage processes) is stopped at once with ``SIGSTOP``, then killed with ``SIGKILL``;
nothing of it runs another instruction, nothing is told.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from typing import Any

import psutil
import ray
from ray.cluster_utils import Cluster
from ray.serve import Application

#: The custom resource only the head node has.
HEAD = "omni_head"


def on_head(app: Application) -> Application:
    """``app`` with its ingress deployment (the gateway) placed on the head node: it asks for
    no CPU and a sliver of :data:`HEAD` (Serve's ``ray_actor_options``)."""
    bound = app._bound_deployment  # noqa: SLF001 - Serve keeps the bound deployment here
    options = dict(bound.ray_actor_options or {})
    options["resources"] = {**options.get("resources", {}), HEAD: 0.01}
    return Application(bound.options(ray_actor_options=options))


@dataclass
class LocalNodes:
    """A head node and worker nodes, each ``node_cpus`` CPUs (Ray's logical ones)."""

    node_cpus: int
    cluster: Cluster = field(init=False)
    workers: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": self.node_cpus, "resources": {HEAD: 1.0}})

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    @property
    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    def add(self) -> Any:
        """Start a worker node and wait until the cluster lists it; the node."""
        node = self.cluster.add_node(num_cpus=self.node_cpus)
        self.workers.append(node)
        return node

    def worker(self) -> Any:
        """A live worker node (a new one when none is)."""
        return self.workers[-1] if self.workers else self.add()

    def processes(self, node: Any) -> list[psutil.Process]:
        """Every process of ``node``: those Ray started for it (its raylet first) and all
        their descendants (the raylet's agents and workers, the workers' stage processes)."""
        roots = [info.process.pid for infos in node.all_processes.values() for info in infos]
        found: dict[int, psutil.Process] = {}
        for pid in roots:
            try:
                root = psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                found.setdefault(proc.pid, proc)
        return list(found.values())

    def kill(self, node: Any, stop_only: bool = False) -> list[str]:
        """Kill every process of worker ``node`` at once (all stopped, then all killed; with
        ``stop_only``, only stopped: a host gone from the network); their names. Returns at
        once: :meth:`forget` kills what is left and reaps them."""
        mine = os.getpid()
        procs = [p for p in self.processes(node) if p.pid != mine]
        names = []
        for proc in procs:
            try:
                names.append(proc.name())
            except psutil.NoSuchProcess:
                names.append("?")
        for sig in (signal.SIGSTOP,) if stop_only else (signal.SIGSTOP, signal.SIGKILL):
            for proc in procs:
                try:
                    proc.send_signal(sig)
                except psutil.NoSuchProcess:
                    pass
        return sorted(names)

    def forget(self, node: Any) -> None:
        """Kill what is left of ``node`` and drop it from the cluster, reaping the processes
        this one started."""
        for proc in self.processes(node):
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.workers.remove(node)
        self.cluster.worker_nodes.discard(node)
        node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()
