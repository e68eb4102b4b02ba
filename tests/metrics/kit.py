"""Reading ``/metrics`` and the metrics tables of the docs (docs/operations.md: one server's;
docs/scaling-out.md: a fleet gateway's own)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server import Server

OPERATIONS = Path(__file__).parents[2] / "docs" / "operations.md"
SCALING_OUT = OPERATIONS.with_name("scaling-out.md")
ROW = re.compile(r"^\| `(sgl_omni_[a-z_]+)` \|\s*(counter|gauge|histogram)\s*\|([^|]*)\|")


def table(page: Path = OPERATIONS) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The metrics documented in ``page``: name -> (type, labels)."""
    out = {}
    for line in page.read_text().splitlines():
        match = ROW.match(line)
        if match:
            labels = tuple(x.strip(" `") for x in match[3].split(",") if x.strip())
            out[match[1]] = (match[2], labels)
    return out


class Scrape:
    """One ``/metrics`` answer, by sample name and labels."""

    def __init__(self, server: Server, headers: dict[str, str] | None = None) -> None:
        resp = httpx.get(f"{server.url}/metrics", headers=headers, timeout=10)
        assert resp.status_code == 200, resp.text
        self.families = {f.name: f for f in text_string_to_metric_families(resp.text)}
        self.samples: dict[tuple[str, frozenset], float] = {}
        for family in self.families.values():
            for s in family.samples:
                self.samples[s.name, frozenset(s.labels.items())] = s.value

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 when absent."""
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of a sample over the labels not given."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= ls)

    def labels(self, name: str, label: str) -> set[str]:
        return {dict(ls)[label] for (n, ls), _ in self.samples.items()
                if n == name and label in dict(ls)}


def family_name(metric: str) -> str:
    """The parser's family name of a documented metric (counters lose ``_total``)."""
    return metric.removesuffix("_total")
