"""``make gpu-wheels``: download, where the package index is reachable, the wheels that ``make
gpu-check`` installs on a GPU machine that has no network.

    python -m tools.gpu_check.wheels --dest .whl            # for a CUDA 13 driver (the default)
    python -m tools.gpu_check.wheels --dest .whl --cuda 12  # for a CUDA 12 driver

What is needed is dlprof's dependencies and its ``gpu`` extra (from ``pyproject.toml``), less what
the GPU machines already have (:data:`ON_GPU_MACHINE`); dlprof itself is imported from the tree,
never built there. Each is resolved with its own dependencies for CPython 3.12 on manylinux
x86-64, once per CUDA major version of cupti-python (a CUDA 12 driver cannot run CUPTI 13; a CUDA
13.0 driver ran cupti-python 13.4 with CUPTI 13.5, the newest of major 13 when this was last
fetched); wheels of what the machines have (numpy) are removed afterwards. The tree and the
wheels must stay under :data:`TREE_AND_WHEELS_LIMIT` together: with ``--cuda 13`` the wheels are
about 50 MiB (duckdb alone 24), so the tree has about 14 MiB, tests' data included.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from tools.gpu_check.install import CUPTI, ROOT, requirements

PYTHON_VERSION = "3.12"
# manylinux tags pip should accept, oldest first: pip takes --platform literally, without the
# older glibc versions a newer one implies. 2.28 is older than any GPU machine's glibc.
PLATFORMS = ("manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 29)))
# What the GPU machines have already (with its own dependencies): never downloaded for them.
ON_GPU_MACHINE = frozenset({"torch", "cupy", "numpy", "pandas", "pyarrow", "rich", "click", "psutil",
                            "nvidia-ml-py", "pygments", "markdown-it-py", "mdurl", "python-dateutil",
                            "pytz", "tzdata", "six", "typing-extensions"})
CUDA_MAJORS = (12, 13)
# Both majors at once pass the limit below (duckdb and CUPTI twice): one is fetched, 13 unless told.
DEFAULT_CUDA_MAJOR = 13
TREE_AND_WHEELS_LIMIT = 64 * 2**20  # small enough to copy to a GPU machine along with the tree


def normalise(name: str) -> str:
    """A project name as PEP 503 compares them (``cupti_python`` and ``cupti-python`` are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wanted() -> list[str]:
    """The distributions a GPU machine lacks for dlprof and ``make gpu-check``."""
    return [name for name in requirements() if normalise(name) not in ON_GPU_MACHINE]


def download_command(dest: Path, names: list[str], cuda_major: int) -> list[str]:
    """``pip download`` of ``names`` (cupti-python at ``cuda_major``) for CPython 3.12 manylinux x86-64."""
    pinned = [f"{CUPTI}>={cuda_major},<{cuda_major + 1}" if name == CUPTI else name for name in names]
    platforms = [flag for tag in PLATFORMS for flag in ("--platform", tag)]
    return [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", PYTHON_VERSION,
            "--implementation", "cp", *platforms, "--dest", str(dest), *pinned]


def project_of(wheel: Path) -> str:
    """The normalised project name of a wheel file (the part of its name before the version)."""
    return normalise(wheel.name.split("-", 1)[0])


def prune(dest: Path) -> list[str]:
    """Remove wheels of projects the GPU machines have; the names of the files removed."""
    removed = []
    for wheel in sorted(dest.glob("*.whl")):
        if project_of(wheel) in ON_GPU_MACHINE:
            wheel.unlink()
            removed.append(wheel.name)
    return removed


def tree_bytes() -> int:
    """The size of this tree as git sees it: tracked files and untracked, unignored ones."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=False).stdout
    return sum((ROOT / name).stat().st_size for name in listed.decode().split("\0")
               if name and (ROOT / name).is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.gpu_check.wheels",
        description="Download the wheels make gpu-check installs on an offline GPU machine.",
        epilog="Example: python -m tools.gpu_check.wheels --dest .whl --cuda 12 --cuda 13")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="where to put them (default: .whl)")
    parser.add_argument("--cuda", type=int, action="append", choices=CUDA_MAJORS, default=None,
                        help=f"CUDA major version of cupti-python to fetch, the driver's (repeatable; default: "
                             f"{DEFAULT_CUDA_MAJOR})")
    args = parser.parse_args(argv)
    args.dest.mkdir(parents=True, exist_ok=True)
    names = wanted()
    for major in args.cuda or (DEFAULT_CUDA_MAJOR,):
        command = download_command(args.dest, names, major)
        print(f"gpu-wheels: CUDA {major}: {' '.join(command[1:4])} ... {' '.join(command[-len(names):])}",
              flush=True)
        if subprocess.run(command, check=False).returncode != 0:
            print(f"gpu-wheels: pip download failed for CUDA {major}", file=sys.stderr)
            return 1
    removed = prune(args.dest)
    if removed:
        print(f"gpu-wheels: left out (the GPU machines have them): {', '.join(removed)}")
    wheels = sorted(args.dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes()
    print(f"gpu-wheels: {len(wheels)} wheels, {size / 2**20:.1f} MiB in {args.dest}; with the tree "
          f"({tree / 2**20:.1f} MiB) {(size + tree) / 2**20:.1f} MiB of the {TREE_AND_WHEELS_LIMIT // 2**20} "
          "MiB a GPU machine receives")
    if size + tree > TREE_AND_WHEELS_LIMIT:
        print("gpu-wheels: too large to copy along: fetch one CUDA version only (--cuda 13, or 12 for an older "
              "driver), or make the tree smaller (tests' data counts)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
