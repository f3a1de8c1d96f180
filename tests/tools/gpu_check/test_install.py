"""Preparing the checks' Python offline: what dlprof needs, which cupti-python a driver can run,
and a virtual environment that sees its parent's packages even when the parent is one itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.gpu_check.install import (
    cupti_requirement,
    make_venv,
    missing,
    parent_pth,
    prepare,
    requirements,
    site_directories,
)

WHEELS = ("cupti_python-12.8.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
          "cupti_python-13.4.0-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
          "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")


def test_dlprofs_needs_come_from_pyproject() -> None:
    names = requirements()
    assert {"orjson", "perfetto", "pyarrow", "pandas", "cupti-python", "nvidia-ml-py"} <= set(names)
    assert len(names) == len(set(names)) and not any(c in n for n in names for c in "<>=[ ")
    assert "torch" not in names  # an extra the GPU machine has its own build of


def test_missing_distributions_are_read_from_the_pythons_metadata() -> None:
    assert missing(sys.executable, ["orjson", "nvidia_ml_py", "surely-not-a-distribution"]) == ["surely-not-a-distribution"]


@pytest.mark.parametrize(("cuda_major", "expected"), [
    (12, "cupti-python>=12,<13"), (13, "cupti-python>=13,<14"), (14, "cupti-python>=13,<14"),
    (0, "cupti-python>=13,<14"), (11, "cupti-python")])
def test_cupti_python_is_taken_at_a_major_the_driver_runs(tmp_path: Path, cuda_major: int, expected: str) -> None:
    for name in WHEELS:
        (tmp_path / name).touch()
    assert cupti_requirement(tmp_path, cuda_major) == expected


def test_the_pth_file_adds_site_directories_with_their_own_pth_files() -> None:
    assert parent_pth(["/usr/lib/python3/dist-packages", "/opt/it's here"]) == (
        "import site; site.addsitedir('/usr/lib/python3/dist-packages')\n"
        "import site; site.addsitedir(\"/opt/it's here\")\n")


def test_a_python_with_everything_is_used_as_it_is(tmp_path: Path) -> None:
    prepared = prepare(sys.executable, tmp_path / "no-wheels", tmp_path / "venv", 13)
    assert prepared.python == sys.executable and prepared.problem == ""
    assert prepared.notes == [f"{sys.executable} has every package dlprof needs: nothing installed"]
    assert not (tmp_path / "venv").exists()


def test_without_wheels_a_bare_python_says_what_to_copy(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    prepared = prepare(str(bare / "bin" / "python"), tmp_path / "no-wheels", tmp_path / "venv", 13)
    assert prepared.problem.startswith(f"{', '.join(requirements())} missing and no wheels in {tmp_path / 'no-wheels'}")
    assert "run `make gpu-wheels` where the package index is reachable and copy .whl along" in prepared.problem
    assert not (tmp_path / "venv").exists()


def test_the_venv_sees_its_parents_packages_when_the_parent_is_a_venv(tmp_path: Path) -> None:
    assert sys.prefix != sys.base_prefix, "this test runs in a virtual environment, as a GPU machine's may be"
    notes: list[str] = []
    assert make_venv(sys.executable, tmp_path / "venv", notes) == ""
    inner = tmp_path / "venv" / "bin" / "python"
    done = subprocess.run([str(inner), "-c", "import orjson, pyarrow, pip, sys; print(sys.prefix)"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "venv")
    assert set(site_directories(sys.executable)) <= set(site_directories(str(inner)))
