"""``GET /v1/videos``: the query (``after``, ``limit``, ``order``, as native SGLang and the OpenAI
API take them) and the page it selects. One rule for a server's own jobs and for the fleet
gateway's merge of every replica's jobs.

Jobs are ordered by ``created_at`` (seconds), then ``id``, newest first unless ``order=asc``.
``after`` starts the page after that job in this order (a job not held, deleted or expired,
gives an empty page, as native does); ``limit`` (1 to 100) caps the page and ``has_more`` says
whether it cut any. Without ``limit`` every job held is listed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sglang_omni.errors import BadRequest

MAX_LIMIT = 100
ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class ListQuery:
    """What a ``GET /v1/videos`` asks for."""

    after: str | None = None
    limit: int | None = None
    order: Literal["asc", "desc"] = "desc"


def list_query(params: Mapping[str, str]) -> ListQuery:
    """The query of ``params`` (the URL's query parameters; others are ignored); BadRequest
    naming the parameter when a value is not one this route takes."""
    limit = params.get("limit")
    if limit is not None:
        digits = limit.strip()
        if not (digits.isascii() and digits.isdigit() and len(digits) <= 3
                and 1 <= int(digits) <= MAX_LIMIT):
            raise BadRequest(f"limit: an integer from 1 to {MAX_LIMIT}, not {limit[:40]!r}")
    order = (params.get("order") or "desc").strip().lower()
    if order not in ORDERS:
        raise BadRequest(f"order: 'asc' or 'desc', not {params['order'][:40]!r}")
    return ListQuery(after=params.get("after"), limit=int(limit) if limit is not None else None,
                     order="asc" if order == "asc" else "desc")


def list_page(jobs: Sequence[Mapping[str, Any]], query: ListQuery) -> dict[str, Any]:
    """The ``VideoJobList`` body of ``jobs`` (job bodies, in any order) for ``query``."""
    ordered = sorted(jobs, key=lambda job: (job.get("created_at", 0), str(job.get("id"))),
                     reverse=query.order == "desc")
    if query.after is not None:
        at = next((i for i, job in enumerate(ordered) if job.get("id") == query.after), None)
        ordered = [] if at is None else ordered[at + 1:]
    more = query.limit is not None and len(ordered) > query.limit
    page = [dict(job) for job in ordered[:query.limit]]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": more}
