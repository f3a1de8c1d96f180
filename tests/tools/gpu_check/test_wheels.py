"""``make gpu-wheels``: what a GPU machine lacks, fetched for its Python and platform."""

from __future__ import annotations

from pathlib import Path

from tools.gpu_check.wheels import ON_GPU_MACHINE, PLATFORMS, download_command, project_of, prune, wanted


def test_only_what_the_gpu_machines_lack_is_wanted() -> None:
    # dlprof's dependencies and gpu extra, less torch/CuPy/pandas/pyarrow/... the machines have
    # (dlprof itself is imported from the tree, so no build backend). A new dependency shows up here.
    assert wanted() == ["duckdb", "orjson", "perfetto", "cupti-python"]


def test_the_download_is_for_cpython_312_manylinux_with_cupti_at_one_cuda_major(tmp_path: Path) -> None:
    command = download_command(tmp_path, ["orjson", "cupti-python"], 12)
    assert command[1:4] == ["-m", "pip", "download"]
    assert "--only-binary=:all:" in command
    assert command[command.index("--python-version") + 1] == "3.12"
    assert command[command.index("--implementation") + 1] == "cp"
    assert [command[i + 1] for i, flag in enumerate(command) if flag == "--platform"] == list(PLATFORMS)
    assert {"manylinux2014_x86_64", "manylinux_2_25_x86_64", "manylinux_2_28_x86_64"} <= set(PLATFORMS)
    assert command[-2:] == ["orjson", "cupti-python>=12,<13"]
    assert command[command.index("--dest") + 1] == str(tmp_path)


def test_wheels_of_what_the_machines_have_are_pruned(tmp_path: Path) -> None:
    names = ["numpy-2.5.5-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
             "orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
             "nvidia_cuda_cupti_cu12-12.9.79-py3-none-manylinux_2_25_x86_64.whl"]
    for name in names:
        (tmp_path / name).touch()
    assert prune(tmp_path) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
    assert project_of(Path(names[2])) == "nvidia-cuda-cupti-cu12"
    assert "numpy" in ON_GPU_MACHINE and "nvidia-ml-py" in ON_GPU_MACHINE
