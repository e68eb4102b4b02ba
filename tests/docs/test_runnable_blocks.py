"""Every command in README.md and docs/*.md is run here, against real servers with the scripted
engines, so the documentation cannot drift from what works.

A fenced ``bash`` or ``python`` block's info string says how (GitHub reads its first word only):

* ``runnable=interleaved``, ``runnable=text-only`` or ``runnable=direct``: run against a scripted
  server of that pipeline (the block's ``127.0.0.1:8000`` becomes the server's address);
* ``runnable=demo``: run against ``sgl-omni serve --demo`` itself (the hf backend on the tiny
  random-weight checkpoint, as ``make demo`` serves it), so what the README says a demo request
  makes is what the demo makes;
* ``runnable=serve``: the block starts a server itself; it must answer ``/health`` ok (its port
  becomes a free one), then it is stopped;
* ``runnable``: needs no server;
* ``creates=a,b``: files the block must have written; ``error``: its output may show an error;
  every block's output stays short (a curl cuts or saves media; no progress meter);
  ``requires=hf``: skipped where the hf extra (torch) is not installed.

Other blocks name why they are not run here: ``needs-gpu`` (a GPU and the real checkpoint),
``needs-ray`` (a Ray cluster: tests/scale runs the same commands), ``installs`` (creates an
environment or installs packages), ``excerpt`` (a fragment of code,
not a command), ``tested-by=PATH`` (the named test executes it). A block with neither fails.
Blocks run in a scratch folder holding links to the repository's ``.venv``, ``configs``,
``tests``, ``benchmarks``, ``scripts`` and ``docs``, so commands read as they do from the
repository root.

The one stand-in: the scripted Reasoner follows a script in the prompt, so on the scripted
servers the demo prompt (:data:`DEMO_PROMPT`) is replaced by a script that makes an image and a
video and then answers (the demo itself makes one image, then answers).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.kit import script
from tests.server import (
    SCRIPTED_CHAT,
    SCRIPTED_GENERATION,
    SCRIPTED_UMM,
    Server,
    free_port,
    kill_own_group,
)
from tests.umm.kit import final, image, video

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)
CHECKED_LANGS = ("bash", "sh", "shell", "python")
REASONS = ("needs-gpu", "needs-ray", "installs", "excerpt")
SERVERS = {
    "interleaved": [*SCRIPTED_UMM, "--model-name", "cosmos3"],
    "text-only": [*SCRIPTED_CHAT, "--model-name", "cosmos3"],
    "direct": [*SCRIPTED_GENERATION, "--model-name", "cosmos3"],
    "demo": ["--demo", "--model-name", "cosmos3"],
}
#: Seconds a server may take to be ready: the demo loads the real model code (and builds the
#: tiny checkpoint the first time) on a loaded two-core machine.
STARTUP_S = {"demo": 300}
#: The most a block may print: a documented command keeps the terminal readable.
MAX_OUTPUT_CHARS = 20_000
LINKED = (".venv", "configs", "tests", "benchmarks", "scripts", "docs", "pyproject.toml")
DEMO_PROMPT = "Draw a red cube, then describe it."
STAND_IN = script(image("a red cube"), video("the red cube turns"),
                  final("A red cube. {media}"), tail=f" {DEMO_PROMPT}")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    tags: dict[str, str]
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def all_blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            words = match[1].split()
            if not words:
                continue
            tags = dict(w.partition("=")[::2] for w in words[1:])
            out.append(Block(page, text.count("\n", 0, match.start()) + 1, words[0], tags,
                             match[2]))
    return out


BLOCKS = [b for b in all_blocks() if "runnable" in b.tags]
#: The Makefile's entry points create .venv and install the extras: a block of them alone needs
#: no tag (the README's first screen shows them as plain commands).
MAKE_ENTRY = re.compile(r"^make (demo|test|serve-demo|lint|bench)\b")


def installs(block: Block) -> bool:
    """Tagged ``installs``, or only Makefile entry points (which create .venv)."""
    lines = [ln for ln in block.code.splitlines() if ln.strip()]
    return "installs" in block.tags or bool(lines) and all(MAKE_ENTRY.match(ln) for ln in lines)


def test_every_command_block_is_run_or_says_why_not() -> None:
    unmarked = [b.id for b in all_blocks() if b.lang in CHECKED_LANGS
                and "runnable" not in b.tags and not any(r in b.tags for r in REASONS)
                and "tested-by" not in b.tags and not installs(b)]
    assert unmarked == [], "mark these blocks runnable=... or needs-gpu/installs/excerpt"
    for block in all_blocks():
        target = block.tags.get("tested-by")
        if target:
            test = ROOT / target
            assert test.is_file(), block.id
            assert block.page.name in test.read_text(), f"{target} does not read {block.id}"
    assert BLOCKS, "no runnable block found"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    """One scripted server per pipeline, started when a block first needs it."""
    started: dict[str, Server] = {}

    class Lazy(dict):
        def __missing__(self, kind: str) -> Server:
            started[kind] = Server(*SERVERS[kind], timeout=STARTUP_S.get(kind, 60))
            self[kind] = started[kind]
            return started[kind]

    yield Lazy()
    for server in started.values():
        server.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs-blocks")
    for name in LINKED:
        if (ROOT / name).exists():
            (folder / name).symlink_to(ROOT / name)
    return folder


def with_port(code: str, port: int, stand_in: bool = True) -> str:
    code = re.sub(r"(127\.0\.0\.1|localhost):8000\b", f"127.0.0.1:{port}", code)
    code = re.sub(r"--port 8000\b", f"--port {port}", code)
    if not stand_in:
        return code
    # the demo prompt sits in a double-quoted JSON or Python string: its quotes escaped
    return code.replace(DEMO_PROMPT, STAND_IN.replace('"', '\\"'))


def command(block: Block, workdir: Path) -> list[str]:
    if block.lang == "python":
        path = workdir / f"block-{block.page.stem}-{block.line}.py"
        path.write_text(block.code)
        return [sys.executable, str(path)]
    return ["bash", "-euo", "pipefail", "-c", block.code]


def run_serve(block: Block, workdir: Path) -> None:
    port = free_port()
    code = with_port(block.code, port)
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"{block.id} exited: {proc.stdout.read()[-3000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{block.id}: no healthy server on port {port} in 90 s")
    finally:
        kill_own_group(proc, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            kill_own_group(proc)
            proc.wait(5)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block: Block, servers: dict[str, Server], workdir: Path) -> None:
    if block.tags.get("requires") == "hf":
        pytest.importorskip("torch", reason="the hf extra is not installed")
    kind = block.tags["runnable"]
    if kind == "serve":
        run_serve(block, workdir)
        return
    code = block.code
    if kind:
        code = with_port(code, servers[kind].port, stand_in=kind != "demo")
    done = subprocess.run(command(Block(block.page, block.line, block.lang, block.tags, code),
                                  workdir), cwd=workdir, capture_output=True, text=True,
                          timeout=150)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{block.id} failed:\n{code}\n{output[-4000:]}"
    assert len(output) <= MAX_OUTPUT_CHARS, \
        f"{block.id} printed {len(output)} characters: cut media or save them to files"
    if "error" not in block.tags:
        assert '"error": {' not in output and '"error":{' not in output, output[-4000:]
    for name in filter(None, block.tags.get("creates", "").split(",")):
        made = workdir / name
        assert made.is_file() and made.stat().st_size > 0, f"{block.id}: {name} not written"
        made.unlink()


def test_the_stand_in_makes_media() -> None:
    """The stand-in prompt is a script the scripted Reasoner follows (an image, a video, an
    answer), so the save-media recipes have media to save."""
    entries = json.loads(STAND_IN.split("<omni-script>")[1].split("</omni-script>")[0])
    assert [e["action"] for e in entries] == ["image", "video", "final"]
