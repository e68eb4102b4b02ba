"""The wheels the GPU recipe carries, derived from ``pyproject.toml`` (never listed by hand).

The GPU machine reaches no package index, so ``benchmarks/run_gpu.sh`` installs wheels carried in
``.whl/``. This script computes what to carry: every package that ``pyproject.toml`` declares
(the base dependencies and the chosen extras, ``hf`` by default), with everything they need in
turn (read from the installed packages' metadata of this environment, which ``make demo`` or
``make test`` installed from the same ``pyproject.toml``, so the versions are the ones the tests
ran), minus

- the torch stack (torch, torchvision, triton, CUDA's own wheels): the GPU image's CUDA build of
  torch is used, never carried (several GB);
- packages the GPU image already has at a version every requirement on it accepts, as read off
  the image into ``benchmarks/gpu_host_packages.txt`` (``python3 -m pip list --format=freeze``
  there).

Usage (from the repository root, on this machine, before the device run)::

    .venv/bin/python benchmarks/gpu_wheels.py            # print name==version, one a line
    .venv/bin/python benchmarks/gpu_wheels.py --dest .whl  # also download them for the GPU host

With ``--dest``, wheels are fetched for CPython 3.12 on x86-64 Linux (the GPU image's Python),
and a wheel over ``--pack-over`` MiB is repacked as ``NAME.tar.xz`` of its files, which
``run_gpu.sh`` unpacks beside the installed wheels (the device tool carries at most 64 MiB).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import io
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
HOST_PACKAGES = Path(__file__).resolve().parent / "gpu_host_packages.txt"
#: The GPU host's interpreter and platform, for markers and for ``pip download``.
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
              "implementation_name": "cpython", "platform_python_implementation": "CPython"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_31_x86_64", "manylinux_2_24_x86_64")
#: The GPU image's CUDA build of these is used; carrying them would cost several GB.
TORCH_STACK = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*)$")


@dataclass
class Needed:
    """One package of the closure: the version installed here and what asks for it."""

    name: str
    version: str
    specifiers: list[SpecifierSet] = field(default_factory=list)
    wanted_by: set[str] = field(default_factory=set)


def declared(extras: Iterable[str], pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement strings ``pyproject.toml`` declares: the base dependencies and ``extras``."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"pyproject.toml has no extra {extra!r}; choose from "
                             f"{', '.join(sorted(optional))}")
        found += optional[extra]
    return found


def closure(requirements: Iterable[str]) -> dict[str, Needed]:
    """Every package the requirements need on the GPU host, transitively, by canonical name,
    with the version installed in this environment."""
    needed: dict[str, Needed] = {}
    todo: list[tuple[Requirement, str]] = [(Requirement(r), "pyproject.toml") for r in requirements]
    while todo:
        req, parent = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**TARGET_ENV, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            raise SystemExit(f"{req.name} (needed by {parent}) is not installed in this "
                             "environment: run this with the .venv that make demo or make test "
                             "created") from None
        entry = needed.get(name)
        first = entry is None
        if entry is None:
            entry = needed[name] = Needed(name, version)
        entry.specifiers.append(req.specifier)
        entry.wanted_by.add(parent)
        extras = sorted(req.extras)
        if not first and not extras:
            continue
        for raw in md.requires(req.name) or []:
            sub = Requirement(raw)
            if sub.marker is not None:
                if not any(sub.marker.evaluate({**TARGET_ENV, "extra": e}) for e in extras + [""]):
                    continue
                sub.marker = None
            todo.append((sub, name))
    return needed


def host_versions(path: Path = HOST_PACKAGES) -> dict[str, str]:
    """The GPU image's packages, ``name==version`` lines (comments allowed)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            found[canonicalize_name(name)] = version.strip()
    return found


def to_carry(needed: dict[str, Needed], host: dict[str, str]) -> list[Needed]:
    """The packages the GPU host lacks, or has at a version some requirement refuses."""
    carry = []
    for entry in sorted(needed.values(), key=lambda e: e.name):
        if TORCH_STACK.match(entry.name):
            continue
        have = host.get(entry.name)
        if have is not None and all(Version(have) in spec for spec in entry.specifiers):
            continue
        carry.append(entry)
    return carry


def download(carry: list[Needed], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "--python-version", TARGET_ENV["python_version"],
            "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    subprocess.run(args + [f"{e.name}=={e.version}" for e in carry], check=True)


def pack_large(dest: Path, over_mib: float) -> None:
    """Repack each wheel over ``over_mib`` as ``<wheel stem>.tar.xz`` of its files."""
    for wheel in sorted(dest.glob("*.whl")):
        if wheel.stat().st_size <= over_mib * 2**20:
            continue
        packed = wheel.with_suffix(".tar.xz")
        with zipfile.ZipFile(wheel) as zf, tarfile.open(packed, "w:xz") as tar:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                data = zf.read(info)
                member = tarfile.TarInfo(info.filename)
                member.size = len(data)
                member.mode = 0o755 if info.filename.endswith(".so") else 0o644
                tar.addfile(member, io.BytesIO(data))
        wheel.unlink()
        print(f"packed {wheel.name} as {packed.name} ({packed.stat().st_size / 2**20:.1f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extras", default="hf", help="comma-separated extras (default: hf)")
    parser.add_argument("--host-packages", type=Path, default=HOST_PACKAGES)
    parser.add_argument("--dest", type=Path, help="download the wheels into this folder")
    parser.add_argument("--pack-over", type=float, default=12.0,
                        help="repack wheels over this many MiB as .tar.xz (default 12)")
    args = parser.parse_args()
    extras = [e for e in args.extras.split(",") if e]
    carry = to_carry(closure(declared(extras)), host_versions(args.host_packages))
    for entry in carry:
        print(f"{entry.name}=={entry.version}")
    if args.dest is not None:
        download(carry, args.dest)
        pack_large(args.dest, args.pack_over)
        total = sum(p.stat().st_size for p in args.dest.iterdir() if p.is_file())
        print(f"{args.dest}: {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
