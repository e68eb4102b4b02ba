"""materialize / load_bytes against real HTTP servers on loopback (see conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest

from sglang_omni.errors import MediaFetchFailed, MediaNotFound, MediaRefused, OmniError
from sglang_omni.media import MediaPolicy, RequestMediaDir, load_bytes, materialize
from tests.kit import wait_for
from tests.media.media_http_server import PNG, MediaServer

LABEL = "messages[0].content[0].image_url"
SMALL_MB = 0.01  # 10485 bytes


def policy(*hosts: str, **kw: object) -> MediaPolicy:
    kw.setdefault("fetch_timeout_s", 0.5)
    kw.setdefault("fetch_deadline_s", 3.0)
    return MediaPolicy(allowed_media_domains=hosts, **kw)  # type: ignore[arg-type]


def run(coro):
    return asyncio.run(coro)


def materialize_in(tmp_path: Path, ref: str, pol: MediaPolicy) -> tuple[str, RequestMediaDir]:
    """Materialize ``ref`` in a fresh request folder, left open (the caller holds it)."""
    workdir = RequestMediaDir(tmp_path)
    return run(materialize(ref, pol, workdir, label=LABEL)), workdir


def fail(
    tmp_path: Path, ref: str, pol: MediaPolicy, exc: type[OmniError], status: int
) -> OmniError:
    """Expect ``ref`` to fail; the request folder must be empty afterwards and removed on exit."""

    async def go() -> OmniError:
        async with RequestMediaDir(tmp_path) as workdir:
            with pytest.raises(exc) as info:
                await materialize(ref, pol, workdir, label=LABEL)
            assert os.listdir(workdir.path) == []  # partial file removed at once
        assert not workdir.path.exists()
        return info.value

    err = run(go())
    assert err.status == status, err.message
    assert LABEL in err.message
    return err


# --- served / refused ----------------------------------------------------------------------------
def test_allowed_host_served_into_request_folder(media_server: MediaServer, tmp_path: Path) -> None:
    pol = policy("127.0.0.1", "localhost")

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            for host in ("127.0.0.1", "localhost"):
                out = await materialize(
                    media_server.url(host, "/ok.png"), pol, workdir, label=LABEL
                )
                assert Path(out).read_bytes() == PNG
                assert workdir.contains(out) and out.endswith(".png")
            # no extension in the URL: the Content-Type supplies one for the engine's decoders
            out = await materialize(media_server.url("127.0.0.1", "/ok"), pol, workdir, label=LABEL)
            assert out.endswith(".png") and Path(out).read_bytes() == PNG
        assert not workdir.path.exists()  # removed when the request ends

    run(go())
    assert media_server.state.paths() == ["/ok.png", "/ok.png", "/ok"]
    assert list(tmp_path.iterdir()) == []


def test_unlisted_host_refused_before_any_fetch(media_server: MediaServer, tmp_path: Path) -> None:
    err = fail(
        tmp_path, media_server.url("127.0.0.2", "/ok.png"), policy("127.0.0.1"), MediaRefused, 400
    )
    assert "not in --allowed-media-domain" in err.message
    assert media_server.state.requests == []


def test_redirect_within_allowlist_followed(media_server: MediaServer, tmp_path: Path) -> None:
    to = media_server.url("127.0.0.2", "/chain/2")
    ref = media_server.url("localhost", f"/redirect?code=307&to={to}")
    out, workdir = materialize_in(tmp_path, ref, policy("localhost", "127.0.0.2"))
    assert Path(out).read_bytes() == PNG
    workdir.close()
    assert [p.split("?")[0] for p in media_server.state.paths()] == [
        "/redirect", "/chain/2", "/chain/1", "/chain/0", "/ok.png"
    ]  # fmt: skip


@pytest.mark.parametrize("target_host", ["127.0.0.2", "127.0.0.1@127.0.0.2"])
def test_redirect_to_unlisted_host_refused(
    media_server: MediaServer, tmp_path: Path, target_host: str
) -> None:
    to = media_server.url(target_host, "/ok.png")
    ref = media_server.url("127.0.0.1", f"/redirect?to={to}")
    err = fail(tmp_path, ref, policy("127.0.0.1", "localhost"), MediaRefused, 400)
    assert "redirected to a refused URL" in err.message
    assert media_server.state.paths() == [f"/redirect?to={to}"]  # the target was never requested


@pytest.mark.parametrize(
    "to", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1/x", "//127.0.0.2/x"]
)
def test_redirect_to_other_schemes_or_hosts_refused(
    media_server: MediaServer, tmp_path: Path, to: str
) -> None:
    ref = media_server.url("127.0.0.1", f"/redirect?to={to}")
    fail(tmp_path, ref, policy("127.0.0.1"), MediaRefused, 400)
    assert len(media_server.state.requests) == 1


def test_redirect_loop_stopped(media_server: MediaServer, tmp_path: Path) -> None:
    err = fail(
        tmp_path,
        media_server.url("127.0.0.1", "/loop"),
        policy("127.0.0.1", max_redirects=3),
        MediaFetchFailed,
        500,
    )
    assert "more than 3 times" in err.message
    assert media_server.state.paths() == ["/loop"] * 4


def test_redirect_limit_counts_hops(media_server: MediaServer, tmp_path: Path) -> None:
    pol = policy("127.0.0.1", max_redirects=2)
    # /chain/N answers N + 1 redirects before the image
    out, workdir = materialize_in(tmp_path, media_server.url("127.0.0.1", "/chain/1"), pol)
    assert Path(out).read_bytes() == PNG
    workdir.close()
    fail(tmp_path, media_server.url("127.0.0.1", "/chain/2"), pol, MediaFetchFailed, 500)


# --- failure statuses ----------------------------------------------------------------------------
def test_404_is_400(media_server: MediaServer, tmp_path: Path) -> None:
    err = fail(
        tmp_path,
        media_server.url("127.0.0.1", "/missing"),
        policy("127.0.0.1"),
        MediaNotFound,
        400,
    )
    assert err.to_body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/error", "/unavailable"])
def test_server_errors_are_500(media_server: MediaServer, tmp_path: Path, path: str) -> None:
    pol = policy("127.0.0.1", max_file_size_mb=SMALL_MB)
    err = fail(tmp_path, media_server.url("127.0.0.1", path), pol, MediaFetchFailed, 500)
    assert err.to_body()["error"]["type"] == "server_error"


@pytest.mark.parametrize(("path", "says"), [
    ("/gzip", "compressed body"), ("/big-declared", "larger than the 0.01 MB limit"),
    ("/big-unsized", "larger than the 0.01 MB limit"),
    ("/gzip-bomb", "compressed body"), ("/gzip-bomb?unsized", "compressed body")])
def test_a_host_sending_more_than_the_limit_is_500(media_server: MediaServer, tmp_path: Path,
                                                   path: str, says: str) -> None:
    """Spec 001's fetch rule: a host that sends more than media_url_max_file_size_mb (declared
    or sent) or a compressed body (never asked for, which may unpack past it) fails the fetch:
    500, the message naming the limit."""
    pol = policy("127.0.0.1", max_file_size_mb=SMALL_MB)
    err = fail(tmp_path, media_server.url("127.0.0.1", path), pol, MediaFetchFailed, 500)
    assert err.to_body()["error"]["type"] == "server_error"
    assert says in err.message
    assert "0.01 MB limit (media_url_max_file_size_mb)" in err.message


def test_connection_refused_is_500(tmp_path: Path) -> None:
    fail(tmp_path, "http://127.0.0.1:1/x.png", policy("127.0.0.1"), MediaFetchFailed, 500)


def test_stalled_host_times_out(media_server: MediaServer, tmp_path: Path) -> None:
    """The stall timeout (0.3 s) ends the fetch, not the host (which holds on for 5 s): the
    message names the timeout and the host sees the fetch hang up."""
    pol = policy("127.0.0.1", fetch_timeout_s=0.3)
    for path in ("/stall-headers", "/stall-body"):
        err = fail(tmp_path, media_server.url("127.0.0.1", path), pol, MediaFetchFailed, 500)
        assert "timed out" in err.message
        wait_for(lambda p=path: p in media_server.state.ended)
        assert media_server.state.ended[path] == "hung up"


def test_trickling_host_hits_the_deadline(media_server: MediaServer, tmp_path: Path) -> None:
    """One byte every 50 ms never trips the stall timeout; the whole-fetch deadline (0.4 s)
    stops it, long before the host's 5 s of trickle: the message names the deadline and the
    host sees the fetch hang up."""
    pol = policy("127.0.0.1", fetch_timeout_s=0.5, fetch_deadline_s=0.4)
    err = fail(tmp_path, media_server.url("127.0.0.1", "/trickle"), pol, MediaFetchFailed, 500)
    assert "longer than 0.4 s" in err.message
    wait_for(lambda: "/trickle" in media_server.state.ended)
    assert media_server.state.ended["/trickle"] == "hung up"


def test_endless_body_cut_off_near_the_limit(media_server: MediaServer, tmp_path: Path) -> None:
    pol = policy("127.0.0.1", max_file_size_mb=SMALL_MB)
    err = fail(tmp_path, media_server.url("127.0.0.1", "/endless"), pol, MediaFetchFailed, 500)
    assert "larger than the 0.01 MB limit" in err.message
    assert media_server.state.endless_done.wait(5), "the server kept sending"
    sent = media_server.state.endless_sent
    # The client hung up after ~10 KiB; what the server pushed beyond that only filled the kernel
    # socket buffers (tens of KiB with a 4 KiB send buffer), nowhere near an unbounded read.
    assert sent < 1024 * 1024, sent


def test_limit_zero_means_unlimited(media_server: MediaServer, tmp_path: Path) -> None:
    out, workdir = materialize_in(
        tmp_path, media_server.url("127.0.0.1", "/ok.png"), policy("127.0.0.1", max_file_size_mb=0)
    )
    assert Path(out).read_bytes() == PNG
    workdir.close()


# --- cancellation and cleanup --------------------------------------------------------------------
def test_cancel_mid_fetch_removes_temp_file(media_server: MediaServer, tmp_path: Path) -> None:
    pol = policy("127.0.0.1", fetch_timeout_s=5, fetch_deadline_s=10)
    seen: dict[str, list[str]] = {}

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            ref = media_server.url("127.0.0.1", "/stall-body")
            task = asyncio.create_task(materialize(ref, pol, workdir, label=LABEL))
            for _ in range(200):  # wait until the server is mid-body (headers + 100 bytes sent)
                await asyncio.sleep(0.01)
                if media_server.state.paths():
                    break
            await asyncio.sleep(0.1)
            seen["during"] = [p.name for p in workdir.path.iterdir()]
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            seen["after"] = os.listdir(workdir.path)
        seen["dir"] = [str(workdir.path.exists())]

    run(go())
    assert len(seen["during"]) == 1  # the temp file being filled
    assert seen["after"] == [] and seen["dir"] == ["False"]


def test_request_cancelled_with_folder_open(media_server: MediaServer, tmp_path: Path) -> None:
    """Cancelling the whole request task removes the folder (async with exits on cancel)."""
    pol = policy("127.0.0.1", fetch_timeout_s=5, fetch_deadline_s=10)
    folders: list[Path] = []

    async def request() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            folders.append(workdir.path)
            await materialize(
                media_server.url("127.0.0.1", "/stall-headers"), pol, workdir, label=LABEL
            )

    async def go() -> None:
        task = asyncio.create_task(request())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
    assert folders and not folders[0].exists()
    assert list(tmp_path.iterdir()) == []


# --- without an allowlist ------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost"])
def test_without_allowlist_loopback_refused_unfetched(
    media_server: MediaServer, tmp_path: Path, host: str
) -> None:
    async def go() -> None:
        for read in (materialize, load_bytes):
            async with RequestMediaDir(tmp_path) as workdir:
                with pytest.raises(MediaRefused, match="public address"):
                    await read(media_server.url(host, "/ok.png"), MediaPolicy(), workdir,
                               label=LABEL)

    run(go())
    assert media_server.state.requests == []


def test_load_bytes_fetches_with_limits(media_server: MediaServer, tmp_path: Path) -> None:
    pol = policy("127.0.0.1", "127.0.0.2", max_file_size_mb=SMALL_MB)

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            assert (
                await load_bytes(
                    media_server.url("127.0.0.2", "/ok.png"), pol, workdir, label=LABEL
                )
                == PNG
            )
            with pytest.raises(MediaFetchFailed, match="larger than"):
                await load_bytes(
                    media_server.url("127.0.0.1", "/endless"), pol, workdir, label=LABEL
                )
            with pytest.raises(MediaNotFound) as info:
                await load_bytes(
                    media_server.url("127.0.0.1", "/missing"), pol, workdir, label=LABEL
                )
            assert info.value.status == 400
            with pytest.raises(MediaRefused):
                to = "file:///etc/passwd"
                await load_bytes(
                    media_server.url("127.0.0.1", f"/redirect?to={to}"), pol, workdir, label=LABEL
                )

    run(go())


def test_load_bytes_local_and_inline(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.png").write_bytes(PNG)
    (root / "big.bin").write_bytes(b"x" * 20_000)
    confined = MediaPolicy(allowed_local_media_path=root, max_file_size_mb=SMALL_MB)
    open_policy = MediaPolicy(max_file_size_mb=SMALL_MB)
    b64 = base64.b64encode(PNG).decode()

    async def go() -> None:
        async with RequestMediaDir(tmp_path) as workdir:
            assert await load_bytes(f"file://{root}/a.png", confined, workdir, label=LABEL) == PNG
            assert await load_bytes(str(root / "a.png"), confined, workdir, label=LABEL) == PNG
            assert await load_bytes(b64, open_policy, workdir, label=LABEL) == PNG
            assert await load_bytes(b64, confined, workdir, label=LABEL) == PNG
            assert (
                await load_bytes(f"data:image/png;base64,{b64}", open_policy, workdir, label=LABEL)
                == PNG
            )
            with pytest.raises(MediaRefused, match="larger than"):
                await load_bytes(str(root / "big.bin"), confined, workdir, label=LABEL)
            for ref in (str(root / "a.png"), str(root / "big.bin"), "/dev/zero", "no such file!",
                        str(root)):
                with pytest.raises(MediaRefused, match="reads no local files"):
                    await load_bytes(ref, open_policy, workdir, label=LABEL)
            for ref in ("/dev/zero", str(root), f"file://{root}/"):
                with pytest.raises(MediaRefused):
                    await load_bytes(ref, confined, workdir, label=LABEL)
            with pytest.raises(MediaRefused, match="is a directory"):
                await load_bytes(f"file://{root}/", confined, workdir, label=LABEL)

    run(go())


# --- data: URLs ----------------------------------------------------------------------------------
def test_data_url_decoded_into_request_folder(tmp_path: Path) -> None:
    ref = "data:image/png;base64," + base64.b64encode(PNG).decode()
    base = tmp_path / "requests"
    base.mkdir()

    async def go() -> str:
        async with RequestMediaDir(base) as workdir:
            out = await materialize(ref, MediaPolicy(), workdir, label=LABEL)
            assert workdir.contains(out) and out.endswith(".png")
            assert Path(out).read_bytes() == PNG
            return out

    out = run(go())
    assert not Path(out).exists() and list(base.iterdir()) == []


def test_data_url_mime_cannot_steer_the_file_name(tmp_path: Path) -> None:
    for mime in ("image/../../x", "image/png/../../../x", "../x"):
        fail(tmp_path, f"data:{mime};base64,YWJj", MediaPolicy(), MediaRefused, 400)
    out, workdir = materialize_in(
        tmp_path, "data:application/x-weird.type;base64,YWJj", MediaPolicy()
    )
    assert Path(out).parent == workdir.path and Path(out).read_bytes() == b"abc"


def test_data_url_over_limit_refused(tmp_path: Path) -> None:
    ref = "data:image/png;base64," + base64.b64encode(b"a" * 10486).decode()
    err = fail(tmp_path, ref, MediaPolicy(max_file_size_mb=SMALL_MB), MediaRefused, 400)
    assert "limit" in err.message
