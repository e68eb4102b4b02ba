"""``GET /v1/videos`` pages: ``after``, ``limit`` and ``order`` as native SGLang takes them, the
rule (``serve.video_listing``) and over HTTP on a real server (scripted generation)."""

from __future__ import annotations

import httpx
import pytest

from sglang_omni.errors import BadRequest
from sglang_omni.serve.direct.video_listing import ListQuery, list_page, list_query
from tests.generation.kit import HTTP, scripted_server, wait_video
from tests.kit import error_of
from tests.server import Server

JOBS = [{"id": "b", "created_at": 10}, {"id": "a", "created_at": 10}, {"id": "c", "created_at": 11},
        {"id": "d", "created_at": 9}]


def ids(body: dict) -> list[str]:
    return [job["id"] for job in body["data"]]


def test_newest_first_then_by_id_whatever_order_the_jobs_come_in() -> None:
    for jobs in (JOBS, JOBS[::-1]):
        body = list_page(jobs, ListQuery())
        assert ids(body) == ["c", "b", "a", "d"]
        assert body["first_id"] == "c" and body["last_id"] == "d" and body["has_more"] is False
    assert ids(list_page(JOBS, ListQuery(order="asc"))) == ["d", "a", "b", "c"]


def test_pages_with_after_and_limit_cover_every_job_once() -> None:
    for order in ("asc", "desc"):
        seen: list[str] = []
        after = None
        while True:
            body = list_page(JOBS, ListQuery(after=after, limit=3, order=order))
            seen += ids(body)
            if not body["has_more"]:
                break
            after = body["last_id"]
        assert seen == ids(list_page(JOBS, ListQuery(order=order)))
    assert list_page(JOBS, ListQuery(limit=4))["has_more"] is False


def test_a_cursor_not_held_gives_an_empty_page() -> None:
    body = list_page(JOBS, ListQuery(after="gone"))
    assert body == {"object": "list", "data": [], "first_id": None, "last_id": None,
                    "has_more": False}


@pytest.mark.parametrize("params, says", [
    ({"limit": "0"}, "limit: an integer from 1 to 100"),
    ({"limit": "101"}, "limit"), ({"limit": "1e309"}, "limit"), ({"limit": "-1"}, "limit"),
    ({"limit": "9" * 5000}, "limit"), ({"limit": "\ud800"}, "limit"), ({"limit": "²"}, "limit"),
    ({"order": "newest"}, "order: 'asc' or 'desc'"),
])
def test_values_the_route_does_not_take_are_refused(params: dict, says: str) -> None:
    with pytest.raises(BadRequest, match=says) as refused:
        list_query(params)
    assert len(refused.value.message) < 200


def test_what_the_route_takes() -> None:
    assert list_query({}) == ListQuery()
    assert list_query({"limit": "100", "order": "ASC", "after": "x", "other": "1"}) == \
        ListQuery(after="x", limit=100, order="asc")


@pytest.fixture(scope="module")
def server():
    with scripted_server("--generation.factory.step_time_s", "0.001") as srv:
        yield srv


def test_pages_over_http(server: Server) -> None:
    made = []
    for i in range(3):
        job = HTTP.post(f"{server.url}/v1/videos", json={"prompt": f"wave {i}", "size": "32x32",
                                                         "num_frames": 2})
        assert job.status_code == 200, job.text
        made.append(job.json()["id"])
    for video_id in made:
        wait_video(server, video_id)
    everything = HTTP.get(f"{server.url}/v1/videos").json()
    assert sorted(ids(everything)) == sorted(made) and everything["has_more"] is False
    first = HTTP.get(f"{server.url}/v1/videos", params={"limit": 2}).json()
    assert ids(first) == ids(everything)[:2] and first["has_more"] is True
    rest = HTTP.get(f"{server.url}/v1/videos",
                    params={"limit": 2, "after": first["last_id"]}).json()
    assert ids(rest) == ids(everything)[2:] and rest["has_more"] is False
    oldest = HTTP.get(f"{server.url}/v1/videos", params={"order": "asc"}).json()
    assert ids(oldest) == ids(everything)[::-1]
    for params in ({"limit": "1e309"}, {"limit": "0"}, {"order": "newest"}):
        resp = HTTP.get(f"{server.url}/v1/videos", params=params)
        assert resp.status_code == 400, resp.text
        assert next(iter(params)) in error_of(resp)["message"]
    for video_id in made:
        assert HTTP.delete(f"{server.url}/v1/videos/{video_id}").status_code == 200
    assert httpx.get(f"{server.url}/v1/videos", params={"after": made[0]}).json()["data"] == []
