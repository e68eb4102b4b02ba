"""The fleet's ``/metrics``: every replica's Prometheus text in one exposition, each sample
labelled with its replica.

A scrape of the fleet's endpoint would otherwise read whichever replica the router picked, so
counters would jump between replicas from one scrape to the next. Here each replica's series
carry ``replica="<Ray replica id>"`` (sum over it for the fleet), and each metric family is one
group (its ``# HELP``/``# TYPE`` once, then every replica's samples), as the text format
requires. Pure code over the replicas' answers (Prometheus text format 0.0.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: The label each replica's sample gains, and each of the gateway's own.
REPLICA_LABEL = "replica"
GATEWAY_LABEL = "gateway"


@dataclass
class _Family:
    header: list[str] = field(default_factory=list)
    samples: list[str] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labelled(sample: str, replica: str, name: str = REPLICA_LABEL) -> str:
    """One sample line with ``<name>="<replica>"`` as its first label."""
    label = f'{name}="{_escape(replica)}"'
    brace = sample.find("{")
    space = sample.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        rest = sample[brace + 1:]
        return f"{sample[:brace]}{{{label}{'' if rest.startswith('}') else ','}{rest}"
    if space == -1:
        return sample  # not a sample line: left as it is
    return f"{sample[:space]}{{{label}}}{sample[space:]}"


def _families(text: str) -> list[tuple[str, _Family]]:
    """The metric families of one exposition, in order (samples before any header: "")."""
    out: dict[str, _Family] = {}
    current = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                current = parts[2]
                out.setdefault(current, _Family()).header.append(line)
            continue
        out.setdefault(current, _Family()).samples.append(line)
    return list(out.items())


def merge(expositions: Sequence[tuple[str, str]], label: str = REPLICA_LABEL) -> str:
    """One exposition of ``(replica, text)`` pairs, each sample labelled ``<label>="<replica>"``:
    families in order of first appearance, each family's header from the first replica that has
    it."""
    merged: dict[str, _Family] = {}
    for replica, text in expositions:
        for name, family in _families(text):
            into = merged.get(name)
            if into is None:
                into = merged[name] = _Family(header=list(family.header))
            into.samples.extend(labelled(s, replica, label) for s in family.samples)
    lines: list[str] = []
    for family in merged.values():
        lines.extend(family.header)
        lines.extend(family.samples)
    return "\n".join(lines) + "\n" if lines else ""


#: The gateway's series saying which replicas answered its last scrape.
REPLICA_UP = "sgl_omni_gateway_replica_up"


def replica_up(gateway: str, answered: Sequence[str], unanswered: Sequence[str]) -> str:
    """The ``sgl_omni_gateway_replica_up`` family: 1 for each replica whose metrics this scrape
    holds, 0 for each that did not answer in time (its series are missing from this scrape)."""
    lines = [f"# HELP {REPLICA_UP} Whether the replica answered this scrape within "
             "fleet_read_s (1) or not (0: its series are left out of it)",
             f"# TYPE {REPLICA_UP} gauge"]
    g = f'{GATEWAY_LABEL}="{_escape(gateway)}"'
    for replicas, value in ((answered, 1), (unanswered, 0)):
        lines.extend(f'{REPLICA_UP}{{{g},{REPLICA_LABEL}="{_escape(r)}"}} {value}'
                     for r in sorted(replicas))
    return "\n".join(lines) + "\n"
