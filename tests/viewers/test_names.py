"""Names shortened together: what differs between rows stays, what they share goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlprof.cli.main import main
from dlprof.viewers.names import distinct_names, readable, signatures_shortened

LAYERS = [f"transformer.h.{i}.attn.c_attn (Conv1D) {d}" for i in range(6) for d in ("forward", "backward")]
CUTLASS = [f"void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_{tile}_align1>"
           f"(cutlass_75_tensorop_bf16_s1688gemm_bf16_{tile}_align1::Params)"
           for tile in ("128x128_tn", "256x128_nn", "128x256_nt")]


@pytest.mark.parametrize("width", [24, 30, 40])
def test_layers_keep_their_index_and_direction(width: int) -> None:
    shortened = distinct_names(LAYERS, width)
    assert len(set(shortened)) == len(LAYERS) and all(len(s) <= width for s in shortened)
    for name, short in zip(LAYERS, shortened, strict=True):
        index = name.split(".")[2]
        assert f"{index}." in short or f"{index}…" in short, short
        assert ("~" in short) or name.rsplit(" ", 1)[1] in short


@pytest.mark.parametrize("width", [30, 40, 60])
def test_kernels_keep_their_tile_layout_and_alignment(width: int) -> None:
    shortened = distinct_names(CUTLASS, width)
    assert len(set(shortened)) == len(CUTLASS)
    for name, short in zip(CUTLASS, shortened, strict=True):
        tile = name.split("bf16_")[2].split("_align1")[0]
        assert tile in short and "align1" in short and len(short) <= width, short


def test_a_signature_reads_without_namespaces_lambdas_or_parameters() -> None:
    kernel = ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
              "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
              "at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul>)")
    assert readable(kernel) == "vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda[](float), array<char*, 2ul>>"
    assert readable("transformer.h.0 (GPT2Block) forward") == "transformer.h.0 (GPT2Block) forward"


def test_names_that_fit_stay_whole_and_alike_ones_get_a_digest() -> None:
    assert distinct_names(["aten::mm", "aten::addmm"], 20) == ["aten::mm", "aten::addmm"]
    twins = ["x" * 50 + "a" + "y" * 50, "x" * 50 + "b" + "y" * 50]
    shortened = distinct_names(twins, 20)
    assert len(set(shortened)) == 2 and all(len(s) <= 20 for s in shortened)


def test_signatures_in_prose_are_shortened_together() -> None:
    text = f"20 launches of {CUTLASS[0]} (CUTLASS align1), 67.3 ms"
    shortened = signatures_shortened(text, 50)
    assert shortened.startswith("20 launches of Kernel2") and shortened.endswith(" (CUTLASS align1), 67.3 ms")
    assert "128x128_tn_align1" in shortened and "::Params" not in shortened


@pytest.mark.parametrize("kind", ["kernel", "module"])
def test_the_h200_runs_top_15_names_are_unique_at_80_columns(
        kind: str, h200_run: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["top", str(h200_run), "--kind", kind, "-n", "15"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rule = next(i for i, line in enumerate(lines) if "────" in line)
    rows = lines[rule + 1:rule + 16]
    names = [row.strip().split("   ")[0] for row in rows]
    assert len(rows) == 15 and len(set(names)) == 15, names
    assert all(len(line) <= 80 for line in lines)
    if kind == "module":
        # Sorted by device time (a GPU run), the blocks lead: each keeps the index that tells it apart.
        assert any("h.0 " in n for n in names) and any("h.5 " in n for n in names)
    else:
        for tile in ("128x128_tn_align1", "256x128_nn_align1", "128x256_nt_align1"):
            assert sum(tile in n for n in names) == 1, names
