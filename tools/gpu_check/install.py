"""The Python the checks run in: the machine's own when it has what dlprof needs, else a virtual
environment beside it, filled from carried wheels and never from the network.

    prepared = prepare(Path(sys.executable), wheels=ROOT / ".whl", venv=ROOT / ".gpu-venv", cuda_major=12)
    prepared.python, prepared.notes, prepared.problem

What dlprof needs is read from ``pyproject.toml`` (its dependencies and the ``gpu`` extra). When
one is missing, ``.gpu-venv`` is made with ``--system-site-packages`` plus a ``.pth`` file that
adds the launching interpreter's own site directories (so that torch and CuPy are seen even when
that interpreter is itself a virtual environment); then ``pip install --no-index --find-links
.whl`` installs only what is missing; dlprof itself is imported from this tree (the checks put it
first on ``PYTHONPATH``), so nothing builds it.
Where no virtual environment can be made, what is missing goes under ``.gpu-venv/prefix`` with
``pip install --prefix`` instead (which, unlike ``--target``, counts the packages the machine has),
and the checks find it on ``PYTHONPATH``.
cupti-python is taken at the CUDA major version the driver supports (its 12.x wheels for a CUDA
12 driver, 13.x for 13), the newest of that major among the wheels: a newer CUPTI of the same
major runs on an older driver (cupti-python 13.4 with CUPTI 13.5 ran on an H200's CUDA 13.0
driver, driver 580.159.04), a newer major does not (CUPTI 13 refuses a CUDA 12 driver). Nothing here touches the machine's own packages. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CUPTI = "cupti-python"
PIP_TIMEOUT_S = 300
_PROBE_TIMEOUT_S = 60
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_CUPTI_WHEEL = re.compile(r"cupti_python-(\d+)\.[^-]*-.*\.whl")


@dataclass
class Prepared:
    """The interpreter to run the checks with, what was done to get it, and what is still wrong."""

    python: str
    notes: list[str] = field(default_factory=list)
    problem: str = ""  # why dlprof cannot run in ``python``; "" when it can
    pythonpath: list[str] = field(default_factory=list)  # directories the checks need on PYTHONPATH


def requirements(pyproject: Path = ROOT / "pyproject.toml", extra: str = "gpu") -> list[str]:
    """dlprof's dependencies and those of one extra, as distribution names (versions dropped)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = [*project["dependencies"], *project["optional-dependencies"][extra]]
    names = []
    for spec in specs:
        match = _NAME.match(spec)
        if match and match.group(0) not in names:
            names.append(match.group(0))
    return names


def missing(python: str, distributions: list[str], pythonpath: list[str] | None = None) -> list[str]:
    """The distributions ``python`` does not have installed (read from its package metadata),
    with ``pythonpath`` on its path."""
    script = ("import importlib.metadata as m, json, sys\n"
              "def absent(name):\n"
              "    try:\n        m.distribution(name)\n    except m.PackageNotFoundError:\n        return True\n"
              "    return False\n"
              "print(json.dumps([n for n in sys.argv[1:] if absent(n)]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else None
    done = subprocess.run([python, "-c", script, *distributions], capture_output=True, text=True,
                          timeout=_PROBE_TIMEOUT_S, check=False, env=env)
    if done.returncode != 0:
        raise OSError(f"{python} could not list its packages: {done.stderr.strip()[-300:]}")
    return [str(name) for name in json.loads(done.stdout)]


def cupti_requirement(wheels: Path, cuda_major: int) -> str:
    """``cupti-python`` pinned to the newest major among the wheels that the driver can run.

    A CUDA 12 driver runs CUPTI 12 but not 13; a newer driver runs older CUPTIs too.
    """
    majors = sorted({int(m.group(1)) for p in wheels.glob("cupti_python-*.whl")
                     if (m := _CUPTI_WHEEL.fullmatch(p.name))})
    usable = [major for major in majors if major <= cuda_major] if cuda_major else majors
    if not usable:
        return CUPTI
    return f"{CUPTI}>={usable[-1]},<{usable[-1] + 1}"


def site_directories(python: str) -> list[str]:
    """The site directories ``python`` reads packages from (its own, its base's, the user's)."""
    script = ("import json, site, sys\n"
              "dirs = site.getsitepackages() + [site.getusersitepackages()]\n"
              "dirs += [p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))]\n"
              "print(json.dumps(list(dict.fromkeys(dirs))))")
    done = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S,
                          check=True)
    return [str(d) for d in json.loads(done.stdout) if Path(d).is_dir()]


def parent_pth(directories: list[str]) -> str:
    """A ``.pth`` file's text that adds ``directories`` as site directories (their own ``.pth``
    files read too), after the environment's own packages."""
    lines = [f"import site; site.addsitedir({directory!r})" for directory in directories]
    return "\n".join(lines) + "\n"


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _run(command: list[str], notes: list[str], timeout_s: float = PIP_TIMEOUT_S,
         env: dict[str, str] | None = None) -> str:
    """Run a set-up command; "" when it worked, else why not in one line."""
    notes.append("$ " + " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False,
                              env={**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
                                   **(env or {})})
    except subprocess.TimeoutExpired:
        return f"{' '.join(command[:4])} did not finish in {timeout_s:.0f} s"
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip().splitlines()
        return f"{' '.join(command[:4])} exited {done.returncode}: {' / '.join(output[-3:])}"
    return ""


def make_venv(python: str, venv: Path, notes: list[str]) -> str:
    """Create ``venv`` over ``python``'s packages; "" or why it could not be made."""
    problem = _run([python, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], notes, 120)
    if problem:
        return problem
    inner = str(_venv_python(venv))
    site = subprocess.run([inner, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=True).stdout.strip()
    Path(site, "_gpu_check_parent.pth").write_text(parent_pth(site_directories(python)))
    if _run([inner, "-m", "pip", "--version"], notes, 60):
        # No pip among the parent's packages: the venv module's own copy, offline.
        return _run([inner, "-m", "ensurepip", "--default-pip"], notes, 120)
    return ""


def prepare(python: str, wheels: Path, venv: Path, cuda_major: int) -> Prepared:
    """The interpreter the checks run in, installing what is missing from ``wheels`` if need be.

    Args:
        python: the machine's Python (with torch, CuPy...).
        wheels: the directory ``make gpu-wheels`` filled (``.whl``).
        venv: where to make the virtual environment when one is needed (``.gpu-venv``).
        cuda_major: the driver's CUDA major version (0 if unknown).
    """
    needed = requirements()
    absent = missing(python, needed)
    if not absent:
        return Prepared(python, [f"{python} has every package dlprof needs: nothing installed"])
    notes = [f"{python} lacks {', '.join(absent)}"]
    inner = str(_venv_python(venv))
    if _venv_python(venv).exists() and not missing(inner, needed):
        return Prepared(inner, [*notes, f"{venv.name} (made before) has them: nothing installed"])
    if not any(wheels.glob("*.whl")):
        return Prepared(python, notes, f"{', '.join(absent)} missing and no wheels in {wheels} to install "
                        "them from: run `make gpu-wheels` where the package index is reachable and copy .whl along")
    if not _venv_python(venv).exists():
        problem = make_venv(python, venv, notes)
        if problem:
            notes.append(f"could not make {venv.name}: {problem}")
            return install_prefix(python, wheels, venv / "prefix", absent, cuda_major, notes)
    still = missing(inner, needed)
    wanted = [cupti_requirement(wheels, cuda_major) if name == CUPTI else name for name in still]
    pip = [inner, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--no-input"]
    if wanted:
        problem = _run([*pip, *wanted], notes)
        if problem:
            return Prepared(inner, notes, f"installing {', '.join(wanted)} from {wheels.name} failed: {problem}")
    # dlprof itself is not installed: the checks import it from this tree, first on PYTHONPATH.
    notes.append(f"installed into {venv.name}: {', '.join(wanted)} (dlprof is imported from the tree)")
    left = missing(inner, needed)
    return Prepared(inner, notes, f"still missing after installing: {', '.join(left)}" if left else "")


def _site_dirs(prefix: Path) -> list[str]:
    """The package directories pip made under an installation prefix (their layout varies by distribution)."""
    return sorted(str(d) for d in prefix.glob("**/*-packages") if d.name in ("site-packages", "dist-packages"))


def install_prefix(python: str, wheels: Path, prefix: Path, absent: list[str], cuda_major: int,
                   notes: list[str]) -> Prepared:
    """Install what ``python`` lacks under ``prefix`` (``pip install --prefix``), for PYTHONPATH."""
    needed = requirements()
    if _site_dirs(prefix) and not missing(python, needed, _site_dirs(prefix)):
        return Prepared(python, [*notes, f"{prefix} (made before) has them: nothing installed"], "",
                        _site_dirs(prefix))
    wanted = [cupti_requirement(wheels, cuda_major) if name == CUPTI else name for name in absent]
    # A system Python marked externally managed (PEP 668) refuses any install; this one touches
    # none of its packages, only a directory of the tree's.
    problem = _run([python, "-m", "pip", "install", "--no-index", "--find-links", str(wheels), "--no-input",
                    "--prefix", str(prefix), *wanted], notes, env={"PIP_BREAK_SYSTEM_PACKAGES": "1"})
    paths = _site_dirs(prefix)
    if problem:
        return Prepared(python, notes, f"installing {', '.join(wanted)} under {prefix} failed: {problem}", paths)
    notes.append(f"installed under {prefix}: {', '.join(wanted)} (dlprof is imported from the tree)")
    left = missing(python, needed, paths)
    return Prepared(python, notes, f"still missing after installing: {', '.join(left)}" if left else "", paths)
