"""Property tests: no generated reference the policy accepts lies outside it.

The oracles are independent of the code under test: for local references the *kernel* opens the
path native SGLang would open and the file it lands on must be one of the inodes under the root;
for URLs, ``urllib`` and httpx (the fetching client) must both see an allowed host, no userinfo
and an http(s) scheme.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import os
import socket
import string
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlparse, urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sglang_omni.errors import MediaRefused
from sglang_omni.media import InlineMedia, LocalMedia, MediaPolicy, RemoteMedia
from sglang_omni.media.inline import is_base64

SETTINGS = settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
LABEL = "images[0]"


# --- local paths ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("media-tree")
    root, outside, sibling = base / "root", base / "outside", base / "rootx"
    (root / "sub" / "deeper").mkdir(parents=True)
    outside.mkdir()
    sibling.mkdir()
    for f in (root / "a.png", root / "sub" / "b.png", root / "sub" / "deeper" / "c.png"):
        f.write_bytes(b"in")
    # the same names outside as inside, so that a wrong turn lands on a real file
    for folder in (outside, sibling, base):
        (folder / "sub").mkdir()
        for f in (folder / "s.png", folder / "a.png", folder / "sub" / "b.png"):
            f.write_bytes(b"secret")
    links = {
        root / "link_out": "../outside",
        root / "link_out_abs": str(outside),
        root / "link_file_out": str(outside / "s.png"),
        root / "link_rootx": "../rootx",
        root / "link_in": "sub",
        root / "link_root": ".",
        root / "sub" / "up": "..",
        root / "sub" / "deeper" / "upup": "../..",
        root / "sub" / "deeper" / "out3": "../../../outside",
        root / "loop1": "loop2",
        root / "loop2": "loop1",
        outside / "back": "../root",
        outside / "back_file": "../root/a.png",
    }
    for link, target in links.items():
        link.symlink_to(target)
    return {"base": base, "root": root, "outside": outside}


def inodes_under(root: Path) -> set[tuple[int, int]]:
    """(dev, inode) of the root and everything under it, links not followed."""
    seen = {(root.stat().st_dev, root.stat().st_ino)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            st_ = os.lstat(os.path.join(folder, name))
            seen.add((st_.st_dev, st_.st_ino))
    return seen


@contextlib.contextmanager
def cwd(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


DIRS = [
    ".", "..", "", "sub", "root", "outside", "rootx", "link_out", "link_out_abs", "link_rootx",
    "link_in", "up", "upup", "out3", "loop1", "back", "%2e%2e", ".%2e", "%2f",
]  # fmt: skip
FILES = [
    "a.png", "b.png", "s.png", "link_file_out", "back_file", "a.png;x", "link_file_out;x",
    "link_file_out;", "a.png?x", "a.png#x", "%00", "..", "link_out",
]  # fmt: skip


@st.composite
def local_refs(draw: st.DrawFn, tree: dict[str, Path]) -> tuple[str, str]:
    """(reference, working directory name): bare paths and file:// URLs of many shapes."""
    root = str(tree["root"])
    prefix = draw(
        st.sampled_from(
            [root, root, root + "x", str(tree["base"]), str(tree["outside"]), "", "/", "./", "../"]
        )
    )
    parts = draw(st.lists(st.sampled_from(DIRS), max_size=3)) + [draw(st.sampled_from(FILES))]
    path = "/".join([prefix.rstrip("/")] + parts) if prefix else "/".join(parts)
    form = draw(st.sampled_from(["bare", "file", "file-localhost", "file-encoded", "FILE"]))
    if form == "bare":
        ref = path
    elif form == "file-encoded":
        safe = draw(st.sampled_from(["", "/", "/.", "/%"]))
        ref = "file://" + quote(path, safe=safe)
    else:
        ref = {"file": "file://", "file-localhost": "file://localhost", "FILE": "FILE://"}[form]
        ref += path
    return ref, draw(st.sampled_from(["root", "sub", "base", "outside"]))


def native_path(ref: str) -> str:
    """The path native SGLang opens for ``ref`` (its file:// rule: unquote(urlparse(ref).path))."""
    return unquote(urlparse(ref).path) if ref.startswith("file://") else ref


@given(data=st.data())
@settings(SETTINGS, max_examples=1500)
def test_no_accepted_local_reference_escapes_the_root(
    tree: dict[str, Path], data: st.DataObject
) -> None:
    root = tree["root"]
    policy = MediaPolicy(allowed_local_media_path=root)
    allowed = inodes_under(root)
    ref, where = data.draw(local_refs(tree))
    folder = {"root": root, "sub": root / "sub", "base": tree["base"], "outside": tree["outside"]}
    with cwd(folder[where]):
        try:
            source = policy.resolve(ref, label=LABEL)
        except MediaRefused:
            return
        assert isinstance(source, LocalMedia | InlineMedia), source
        event(type(source).__name__)
        # what native SGLang would open from the original string, and what Omni hands the engine
        candidates = [native_path(ref)]
        if isinstance(source, LocalMedia):
            candidates.append(str(source.path))
        for candidate in candidates:
            try:
                fd = os.open(candidate, os.O_RDONLY | os.O_NONBLOCK)
            except (OSError, ValueError):
                continue  # nothing to read, nothing leaked
            try:
                st_ = os.fstat(fd)
            finally:
                os.close(fd)
            assert (st_.st_dev, st_.st_ino) in allowed, (ref, candidate)


@given(data=st.data())
@SETTINGS
def test_no_local_file_without_the_flag(tree: dict[str, Path], data: st.DataObject) -> None:
    ref, _ = data.draw(local_refs(tree))
    source = None
    with contextlib.suppress(MediaRefused):
        source = MediaPolicy().resolve(ref, label=LABEL)
    if ref.lower().startswith("file:"):
        assert source is None
    elif source is not None:  # only strict base64 is accepted, as inline data, never a file
        assert isinstance(source, InlineMedia) and source.payload.payload == ref


# --- URLs ----------------------------------------------------------------------------------------
ALLOWED = ("allowed.test", "127.0.0.1", "::1")
HOSTS = [
    "allowed.test", "ALLOWED.test", "allowed.test.", "evil.test", "allowed.test.evil.test",
    "evilallowed.test", "127.0.0.1", "127.1", "2130706433", "0x7f000001", "[::1]", "[0::1]",
    "[::ffff:127.0.0.1]", "[::1%25eth0]", "localhost", "allowed.test\\@evil.test",
    "evil.test\\.allowed.test", "allowed%2etest", "allowed.test%00", "xn--llowed-4za.test",
    "allowed\u2024test", "\uff41llowed.test", "allowed.test#@evil.test", "allowed.test?@evil.test",
    "evil.test#.allowed.test", "evil.test/.allowed.test", "allowed.test\t", "", "[", "]",
]  # fmt: skip
USERINFO = ["", "", "", "user@", "allowed.test@", "user:pw@", "allowed.test:80@", "@", "a@b@"]
PORTS = ["", "", ":80", ":8080", ":0", ":65536", ":abc", ":", ":-1", ": 80"]
SCHEMES = ["http", "https", "HTTP", "hTtPs", "ftp", "file", "gopher", "javascript", "ws", "data"]
SEPARATORS = ["://", "://", "://", ":/", ":", ":///", ":\\\\", "://\\"]


def mostly(common: list[str], rare: list[str]) -> st.SearchStrategy[str]:
    """Usually a well-formed piece, so that many generated URLs get past the syntax rules."""
    return st.one_of(st.sampled_from(common), st.sampled_from(common), st.sampled_from(rare))


@st.composite
def urls(draw: st.DrawFn) -> str:
    host = draw(
        st.one_of(
            mostly(
                ["allowed.test", "ALLOWED.test.", "127.0.0.1", "[::1]", "evil.test"]
                + ["evilallowed.test", "allowed.test.evil.test", "127.1", "sub.allowed.test"],
                HOSTS,
            ),
            st.text(max_size=12),
        )
    )
    path = draw(
        st.one_of(
            st.text(alphabet=string.ascii_letters + string.digits + "/._-%@:", max_size=16),
            st.text(alphabet=string.printable + "\u00e9\u2215\uff0f", max_size=16),
        )
    )
    return (
        draw(mostly(["http", "https", "HTTP"], SCHEMES))
        + draw(mostly(["://"], SEPARATORS))
        + draw(mostly([""], USERINFO))
        + host
        + draw(mostly(["", ":8080"], PORTS))
        + draw(st.sampled_from(["/", "", "?", "#"]))
        + path
    )


def norm(host: str) -> str:
    host = host.strip("[]").lower().rstrip(".")
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    return host


@given(ref=urls())
@SETTINGS
def test_no_accepted_url_outside_the_allowlist(ref: str) -> None:
    try:
        source = MediaPolicy(allowed_media_domains=ALLOWED).resolve(ref, label=LABEL)
    except MediaRefused:
        return
    assert isinstance(source, RemoteMedia) and source.allow_private, (ref, source)
    event("accepted")
    url = source.url.url
    theirs = urlsplit(url)
    assert theirs.scheme in ("http", "https")
    assert theirs.username is None and theirs.password is None and "@" not in theirs.netloc
    assert theirs.hostname is not None and norm(theirs.hostname) in ALLOWED, ref
    fetched = httpx.URL(url)
    assert fetched.userinfo == b"" and fetched.scheme in ("http", "https")
    assert norm(fetched.raw_host.decode("ascii")) in ALLOWED, ref
    assert "\\" not in url and url.isascii() and url.isprintable() and " " not in url


@given(ref=urls())
@SETTINGS
def test_urls_without_allowlist_are_http_only(ref: str) -> None:
    try:
        source = MediaPolicy().resolve(ref, label=LABEL)
    except MediaRefused:
        return
    assert isinstance(source, RemoteMedia) and not source.allow_private
    assert source.url.url.startswith(("http://", "https://"))
    assert urlsplit(source.url.url).username is None and httpx.URL(source.url.url).userinfo == b""
    # the host the client would connect to, read by the C library: never a non-public literal
    host = httpx.URL(source.url.url).raw_host.decode("ascii")
    address = None
    if ":" in host:
        address = ipaddress.ip_address(host)
    else:
        with contextlib.suppress(OSError):
            address = ipaddress.ip_address(socket.inet_ntoa(socket.inet_aton(host)))
    if address is not None:
        event("IP literal accepted")
        assert address.is_global and not address.is_multicast, ref
    assert host.rstrip(".") != "localhost", ref


@given(ref=st.text(max_size=40))
@SETTINGS
def test_arbitrary_strings_never_crash(ref: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    for policy in (MediaPolicy(), MediaPolicy(allowed_media_domains=ALLOWED)):
        with contextlib.suppress(MediaRefused):
            policy.resolve(ref, label=LABEL)


# --- data: URLs ----------------------------------------------------------------------------------
@given(
    payload=st.binary(min_size=1, max_size=3000),
    mime=st.sampled_from(["image/png", "video/mp4", ""]),
)
@SETTINGS
def test_data_urls_accepted_exactly_up_to_the_limit(payload: bytes, mime: str) -> None:
    limit_mb = 1500 / (1024 * 1024)  # 1500 bytes
    policy = MediaPolicy(max_file_size_mb=limit_mb)
    ref = f"data:{mime};base64,{base64.b64encode(payload).decode()}"
    try:
        source = policy.resolve(ref, label=LABEL)
    except MediaRefused as e:
        assert len(payload) > 1500, e.message
        return
    assert len(payload) <= 1500
    assert isinstance(source, InlineMedia) and source.payload.decoded_size == len(payload)


# --- strict base64 -------------------------------------------------------------------------------
def _native_decodes(text: str) -> bool:
    """The oracle: whole quads that ``base64.b64decode(validate=True)`` (native SGLang's
    decoding of inline media) accepts."""
    if not text or len(text) % 4:
        return False
    try:
        base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error, or a non-ASCII str
        return False
    return True


@SETTINGS
@given(st.one_of(
    st.text(alphabet="AZaz09+/=", max_size=12),
    st.text(alphabet="AZaz09+/=\n -_\u00e9\ud800", max_size=12),
    st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode()),
))
def test_strict_base64_is_what_native_decodes(text: str) -> None:
    assert is_base64(text) == _native_decodes(text)
