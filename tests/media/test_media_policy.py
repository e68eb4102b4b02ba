"""MediaPolicy.check / resolve: the synchronous allow/refuse decision, attacked directly."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from sglang_omni.errors import MediaRefused
from sglang_omni.media import (
    NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB,
    InlineMedia,
    LocalMedia,
    MediaPolicy,
    RemoteMedia,
)

LABEL = "messages[0].content[1].image_url"


def refused(policy: MediaPolicy, ref: str, *needles: str) -> MediaRefused:
    with pytest.raises(MediaRefused) as info:
        policy.check(ref, label=LABEL)
    err = info.value
    assert err.status == 400 and err.to_body()["error"]["code"] == 400
    assert LABEL in err.message
    for needle in needles:
        assert needle in err.message, err.message
    return err


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """root/ (allowed) with a file, a subfolder and links; outside/ and a prefix-sibling rootx/."""
    root, outside, sibling = tmp_path / "root", tmp_path / "outside", tmp_path / "rootx"
    for d in (root / "sub", outside, sibling):
        d.mkdir(parents=True)
    (root / "cat.png").write_bytes(b"png")
    (root / "sub" / "dog.png").write_bytes(b"png")
    (outside / "secret.png").write_bytes(b"secret")
    (sibling / "secret.png").write_bytes(b"secret")
    (root / "link_out").symlink_to(outside)
    (root / "link_secret.png").symlink_to(outside / "secret.png")
    (root / "link_in.png").symlink_to(root / "cat.png")
    (root / "sub" / "up").symlink_to("..")
    (root / "link_rel_out").symlink_to("../outside")
    return {"root": root, "outside": outside, "sibling": sibling}


def test_native_default_limit() -> None:
    assert NATIVE_MEDIA_URL_MAX_FILE_SIZE_MB == 64
    assert MediaPolicy().max_file_size_mb == 64
    assert MediaPolicy().max_bytes == 64 * 1024 * 1024
    assert MediaPolicy(max_file_size_mb=0).max_bytes is None


# --- file URLs and local paths -------------------------------------------------------------------
def test_file_url_needs_the_flag(tree: dict[str, Path]) -> None:
    policy = MediaPolicy()
    refused(policy, f"file://{tree['root']}/cat.png", "--allowed-local-media-path")
    refused(policy, "file:///etc/passwd", "--allowed-local-media-path")
    refused(policy, "FILE:///etc/passwd", "--allowed-local-media-path")


def test_bare_paths_refused_without_the_flag(tree: dict[str, Path]) -> None:
    """Secure by default: with no flag no local file is read, whatever the spelling."""
    policy = MediaPolicy()
    for ref in ("/etc/hostname", "relative/img.png", str(tree["root"] / "cat.png"),
                "./abcd", "../etc/passwd", str(tree["root"])):
        refused(policy, ref, "--allowed-local-media-path", "reads no local files")
    # a strict base64 string is inline data (never opened as a file)
    payload = base64.b64encode(b"\x89PNG....").decode()
    assert isinstance(policy.resolve(payload, label=LABEL), InlineMedia)


def test_directory_is_a_400_naming_the_field(tree: dict[str, Path]) -> None:
    policy = MediaPolicy(allowed_local_media_path=tree["root"])
    for ref in (str(tree["root"]), str(tree["root"] / "sub"), f"file://{tree['root']}/sub/",
                f"file://{tree['root']}/link_in.png/..", f"{tree['root']}/sub/up"):
        refused(policy, ref, "is a directory")


def test_missing_and_special_files_refused(tree: dict[str, Path]) -> None:
    root = tree["root"]
    os.mkfifo(root / "fifo.png")
    policy = MediaPolicy(allowed_local_media_path=root)
    refused(policy, f"file://{root}/nope.png", "no such file")
    refused(policy, str(root / "fifo.png"), "not a regular file")


def test_file_url_inside_root_allowed(tree: dict[str, Path]) -> None:
    root = tree["root"]
    policy = MediaPolicy(allowed_local_media_path=root)
    for ref in (
        f"file://{root}/cat.png",
        f"file://localhost{root}/cat.png",
        f"file://{root}/sub/../cat.png",
        f"file://{root}/sub/%2e%2e/cat.png",
        f"file://{root}/link_in.png",
        f"file://{root}/c%61t.png",
    ):
        assert policy.resolve(ref, label=LABEL) == LocalMedia(root / "cat.png"), ref


@pytest.mark.parametrize(
    "suffix",
    [
        "/../outside/secret.png",
        "/%2e%2e/outside/secret.png",
        "/%2E%2E%2Foutside%2Fsecret.png",
        "/sub/../../outside/secret.png",
        "/link_out/secret.png",
        "/link_secret.png",
        "/link_rel_out/secret.png",
        "/sub/up/../outside/secret.png",
        "/link_out/../rootx/secret.png",
        "x/secret.png",  # <tmp>/rootx/secret.png: a prefix sibling, not a child
    ],
)
def test_file_url_escapes_refused(tree: dict[str, Path], suffix: str) -> None:
    policy = MediaPolicy(allowed_local_media_path=tree["root"])
    refused(policy, f"file://{tree['root']}{suffix}", "outside --allowed-local-media-path")


@pytest.mark.parametrize(
    "ref",
    [
        "file://evil.example/etc/passwd",
        "file:/etc/passwd",
        "file:etc/passwd",
        "FILE:///etc/passwd",
        "file:///etc/passwd?x",
        "file:///etc/passwd#x",
        "file://",
    ],
)
def test_file_url_odd_forms_refused(tree: dict[str, Path], ref: str) -> None:
    policy = MediaPolicy(allowed_local_media_path=tree["root"])
    refused(policy, ref)


def test_file_url_semicolon_is_literal(tree: dict[str, Path]) -> None:
    # urlparse splits ";params" only for some schemes, not file: native SGLang reads it literally
    root = tree["root"]
    policy = MediaPolicy(allowed_local_media_path=root)
    (root / "link_secret.png;x").write_bytes(b"png")
    ref = f"file://{root}/link_secret.png;x"
    assert policy.resolve(ref, label=LABEL) == LocalMedia(root / "link_secret.png;x")


def test_bare_paths_confined_once_flag_set(
    tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tree["root"]
    policy = MediaPolicy(allowed_local_media_path=root)
    assert policy.resolve(str(root / "sub/dog.png"), label=LABEL) == LocalMedia(
        root / "sub/dog.png"
    )
    for ref in (
        str(tree["outside"] / "secret.png"),
        f"{root}/../outside/secret.png",
        f"{root}/link_out/secret.png",
        f"{root}/link_secret.png",
        str(tree["sibling"] / "secret.png"),
        "/etc/passwd",
    ):
        refused(policy, ref, "outside --allowed-local-media-path")
    # relative paths resolve against the working directory, as native SGLang opens them
    monkeypatch.chdir(root / "sub")
    assert policy.resolve("dog.png", label=LABEL) == LocalMedia(root / "sub/dog.png")
    assert policy.resolve("../cat.png", label=LABEL) == LocalMedia(root / "cat.png")
    refused(policy, "../../outside/secret.png", "outside")
    refused(policy, "up/../../outside/secret.png", "outside")


def test_base64_under_root_is_inline_unless_it_names_a_file(
    tree: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = MediaPolicy(allowed_local_media_path=tree["root"])
    payload = base64.b64encode(b"\x89PNG....").decode()
    assert isinstance(policy.resolve(payload, label=LABEL), InlineMedia)
    # a base64-looking name that exists outside the root is a path, and refused
    monkeypatch.chdir(tree["outside"])
    (tree["outside"] / "abcd").write_bytes(b"secret")
    refused(policy, "abcd", "outside")


def test_nul_and_empty_refused(tree: dict[str, Path]) -> None:
    for policy in (MediaPolicy(), MediaPolicy(allowed_local_media_path=tree["root"])):
        refused(policy, f"{tree['root']}/cat.png\x00.jpg", "NUL")
        refused(policy, "", "empty")
    with pytest.raises(MediaRefused):
        MediaPolicy().check(None, label=LABEL)  # type: ignore[arg-type]


def test_root_must_be_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a directory"):
        MediaPolicy(allowed_local_media_path=tmp_path / "missing")


def test_root_given_through_a_symlink(tree: dict[str, Path], tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(tree["root"])
    policy = MediaPolicy(allowed_local_media_path=alias)
    assert policy.allowed_local_media_path == tree["root"]
    assert policy.resolve(f"file://{alias}/cat.png", label=LABEL) == LocalMedia(
        tree["root"] / "cat.png"
    )


# --- schemes and remote URLs ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref",
    [
        "ftp://localhost/a.png",
        "gopher://localhost:70/_x",
        "javascript:alert(1)",
        "ws://localhost/a",
        "jar:file:///x!/a.png",
        "a:b.png",
        "c:\\windows\\win.ini",
    ],
)
def test_other_schemes_refused(ref: str) -> None:
    refused(MediaPolicy(), ref, "not allowed")
    refused(MediaPolicy(allowed_media_domains=("localhost",)), ref, "not allowed")


def test_public_hosts_fetched_by_omni_without_allowlist() -> None:
    source = MediaPolicy().resolve("HTTPS://Example.com/a.png?x=1", label=LABEL)
    assert isinstance(source, RemoteMedia) and not source.allow_private
    assert source.url.url == "https://Example.com/a.png?x=1"
    for ref in ("http://8.8.8.8/a.png", "http://[2001:4860:4860::8888]/a.png"):
        source = MediaPolicy().resolve(ref, label=LABEL)
        assert isinstance(source, RemoteMedia) and not source.allow_private


def test_allowlisted_host_fetched_by_omni() -> None:
    policy = MediaPolicy(allowed_media_domains=("Example.COM.", "127.0.0.1", "[::1]"))
    assert policy.allowed_media_domains == ("127.0.0.1", "::1", "example.com")
    for ref in (
        "https://example.com/a.png",
        "http://EXAMPLE.com.:8080/a.png",
        "http://127.0.0.1:1/x",
        "http://[::1]:8000/x",
        "http://[0:0:0:0:0:0:0:1]/x",
    ):
        source = policy.resolve(ref, label=LABEL)
        assert isinstance(source, RemoteMedia) and source.allow_private, ref


#: Every spelling of a non-public host; none may be fetched without an allowlist entry.
NON_PUBLIC_URLS = [
    "http://127.0.0.1/x",
    "http://127.1/x",
    "http://127.0.1/x",
    "http://2130706433/x",
    "http://0x7f.0.0.1/x",
    "http://0x7f000001/x",
    "http://0177.0.0.1/x",
    "http://017700000001/x",
    "http://127.0.0.1./x",
    "http://127.255.255.254:8080/x",
    "https://127.0.0.1:8443/x",
    "http://[::ffff:127.0.0.1]/x",
    "http://[::ffff:7f00:1]/x",
    "http://[0:0:0:0:0:ffff:7f00:1]/x",
    "http://[::1]/x",
    "http://[0:0:0:0:0:0:0:1]/x",
    "http://[::127.0.0.1]/x",
    "http://0.0.0.0/x",
    "http://0/x",
    "http://[::]/x",
    "http://localhost/x",
    "http://LOCALHOST./x",
    "http://api.localhost/x",
    "http://10.0.0.1/x",
    "http://012.0.0.1/x",
    "http://172.16.0.1/x",
    "http://192.168.1.1/x",
    "http://169.254.169.254/latest/meta-data/",
    "http://0xa9fea9fe/latest/meta-data/",
    "http://100.64.0.1/x",
    "http://198.18.0.1/x",
    "http://224.0.0.1/x",
    "http://239.255.255.250/x",
    "http://240.0.0.1/x",
    "http://255.255.255.255/x",
    "http://[fe80::1]/x",
    "http://[fc00::1]/x",
    "http://[fd12:3456::1]/x",
    "http://[ff02::1]/x",
    "http://[2002:7f00:1::]/x",  # 6to4 of 127.0.0.1
    "http://[64:ff9b::7f00:1]/x",  # NAT64 of 127.0.0.1
    "http://[2001:db8::1]/x",  # documentation
]


@pytest.mark.parametrize("ref", NON_PUBLIC_URLS)
def test_non_public_hosts_refused_in_every_spelling(ref: str) -> None:
    err = refused(MediaPolicy(), ref)
    # httpx refuses dotted octal (0177.0.0.1) as a URL outright; all others by address
    reason = "not a valid URL" if ref in ("http://0177.0.0.1/x", "http://012.0.0.1/x") \
        else "remote media must be on a public address (list an internal host with " \
        "--allowed-media-domain)"
    assert reason in err.message, err.message
    with pytest.raises(MediaRefused, match="redirected to a refused URL"):
        MediaPolicy().check_redirect(ref, label=LABEL)


@pytest.mark.parametrize("ref", ["http://[fe80::1%25eth0]/x", "http://[::1%251]/x"])
def test_ipv6_zone_ids_refused(ref: str) -> None:
    refused(MediaPolicy(), ref, "zone identifiers")
    refused(MediaPolicy(allowed_media_domains=("fe80::1", "::1")), ref, "zone identifiers")


def test_allowlisted_host_may_be_private() -> None:
    policy = MediaPolicy(allowed_media_domains=("localhost", "10.0.0.5"))
    for ref in ("http://localhost:8000/a.png", "http://10.0.0.5/a.png"):
        source = policy.resolve(ref, label=LABEL)
        assert isinstance(source, RemoteMedia) and source.allow_private
    # only the listed spelling: another spelling of the same address is another host
    refused(policy, "http://127.0.0.1/a.png", "not in --allowed-media-domain")
    refused(policy, "http://10.5/a.png", "not in --allowed-media-domain")


@pytest.mark.parametrize(
    "ref",
    [
        "http://evil.com/a.png",
        "http://example.com.evil.com/a.png",
        "http://evilexample.com/a.png",
        "http://sub.example.com/a.png",
        "http://127.1/x",
        "http://2130706433/x",
        "http://0x7f.0.0.1/x",
        "http://[::ffff:127.0.0.1]/x",
        "http://xn--exmple-cua.com/",  # exämple.com
    ],
)
def test_unlisted_hosts_refused(ref: str) -> None:
    policy = MediaPolicy(allowed_media_domains=("example.com", "127.0.0.1"))
    refused(policy, ref, "not in --allowed-media-domain")


@pytest.mark.parametrize(
    "ref",
    [
        "http://example.com@evil.com/a.png",
        "http://example.com:80@evil.com/a.png",
        "http://user:pass@example.com/a.png",
        "http://evil.com\\@example.com/",
        "http://example.com\\.evil.com/",
        "http://exämple.com/",
        "http://example.com/\u202e",
        "http:/example.com/a.png",
        "http:///example.com/a.png",
        "http://example.com:99999/",
        "http://example.com:abc/",
        "http://example.com:/",
        "http://[::1%25lo]/",
        "http://[fe80::1/",
        "http://exa mple.com/",
        "http://example.com/a b.png",
        "http://example.com\t/",
        "http://example%2ecom/",
        "http://-example.com/",
        "http://",
    ],
)
def test_malformed_and_tricky_urls_refused(ref: str) -> None:
    policy = MediaPolicy(allowed_media_domains=("example.com", "::1"))
    refused(policy, ref)
    refused(MediaPolicy(), ref)  # syntax rules hold without an allowlist too


@pytest.mark.parametrize(
    "entry",
    ["http://example.com", "example.com/x", "user@example.com", "example.com:80", "", "*.x"],
)
def test_bad_allowlist_entries_rejected(entry: str) -> None:
    with pytest.raises(ValueError):
        MediaPolicy(allowed_media_domains=(entry,))


def test_allowlist_entries_idna_normalized() -> None:
    policy = MediaPolicy(allowed_media_domains=("bücher.de",))
    assert policy.allowed_media_domains == ("xn--bcher-kva.de",)
    source = policy.resolve("http://xn--bcher-kva.de/a.png", label=LABEL)
    assert isinstance(source, RemoteMedia) and source.allow_private


# --- data: URLs ----------------------------------------------------------------------------------
def test_data_url_size_checked_before_decoding() -> None:
    policy = MediaPolicy(max_file_size_mb=0.01)  # 10485 bytes
    small = base64.b64encode(b"a" * 10485).decode()
    big = base64.b64encode(b"a" * 10486).decode()
    assert isinstance(policy.resolve(f"data:image/png;base64,{small}", label=LABEL), InlineMedia)
    refused(policy, f"data:image/png;base64,{big}", "0.01 MB limit")
    unlimited = MediaPolicy(max_file_size_mb=0)
    assert isinstance(unlimited.resolve(f"data:;base64,{big}", label=LABEL), InlineMedia)


@pytest.mark.parametrize(
    "ref",
    [
        "data:image/png,rawbytes",
        "data:image/png;base64",
        "data:image/png;base64,abc",
        "data:image/png;base64,ab!d",
        "data:image/png;base64,YW Jj",
        "data:image/png;base64,YQ===",
        "data:../../x;base64,YWJj",
    ],
)
def test_bad_data_urls_refused(ref: str) -> None:
    refused(MediaPolicy(), ref)


def test_error_message_preview_is_bounded() -> None:
    err = refused(MediaPolicy(), "gopher://" + "a" * 10_000)
    assert len(err.message) < 400


def test_resolution_does_not_touch_cwd_files(tmp_path: Path) -> None:
    before = set(os.listdir(tmp_path))
    with pytest.raises(MediaRefused, match="no such file"):
        MediaPolicy(allowed_local_media_path=tmp_path).check(f"file://{tmp_path}/x.png",
                                                             label=LABEL)
    assert set(os.listdir(tmp_path)) == before


def test_long_bare_strings_under_root_are_inline_and_size_checked(tree: dict[str, Path]) -> None:
    policy = MediaPolicy(allowed_local_media_path=tree["root"], max_file_size_mb=0.01)
    ok = base64.b64encode(b"a" * 9000).decode()  # longer than PATH_MAX, under the limit
    assert isinstance(policy.resolve(ok, label=LABEL), InlineMedia)
    refused(policy, base64.b64encode(b"a" * 20000).decode(), "limit")
    refused(policy, "/" + "a/" * 3000, "not valid base64")  # too long to be a path
