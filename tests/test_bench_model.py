"""`rnngraph bench --model charlm` on the CPU at tiny sizes: the table and JSON of a whole training step with
torch.nn's LSTM against rnngraph.torch in each mode, fp32 and autocast bf16, every loss agreeing; a cell
torch.nn lacks; a disagreement reported as one; the options checked before measuring."""
import json

import pytest

torch = pytest.importorskip("torch")
from rnngraph.lab.bench_model import autocast_refused  # noqa: E402
from rnngraph.lab.cli import main  # noqa: E402


def test_quick_model_bench_runs_and_its_losses_agree(tmp_path, capsys):
    path = tmp_path / "model.json"
    assert main(["bench", "--model", "charlm", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    table = out[out.index("cell  T"):].splitlines()
    assert table[0].split()[:10] == ["cell", "T", "B", "H", "layers", "precision", "torch", "ms", "default", "ms"]
    rows = [line.split() for line in table[1:5]]
    assert [(r[0], r[2], r[5]) for r in rows] == [("lstm", "1", "fp32"), ("lstm", "1", "bf16"), ("lstm", "2", "fp32"),
                                                  ("lstm", "2", "bf16")]
    assert all(r[-2] == "yes" for r in rows)
    assert "skipped graph: graph mode needs CUDA tensors" in out
    data = json.loads(path.read_text())
    assert data["settings"]["layers"] == 2 and data["settings"]["impls"] == ["torch", "default", "staged", "graph"]
    ran = [r for r in data["results"] if "ms_per_step" in r]
    refused = autocast_refused("LSTM", "bf16")      # oneDNN has no bfloat16 LSTM on some CPUs (AVX2)
    assert {r["impl"] for r in ran} == {"torch", "default", "staged"} and len(ran) == (10 if refused else 12)
    for r in ran:
        assert r["ms_per_step"] > 0 and r["first_s"] >= 0 and len(r["losses"]) == 3 + 2
        ref = "torch@fp32" if refused and r["precision"] == "bf16" else "torch"
        assert r["reference"] == ref and r["losses_agree"] and r["loss_diff"] <= r["loss_tol"]
    if refused:                 # said as a skip, not a failure: the command succeeds
        assert f"skipped torch: {refused}" in out
    bf16 = [r for r in ran if r["precision"] == "bf16" and r["impl"] != "torch"]
    assert all(0 < r["loss_diff"] for r in bf16)         # really computed in bfloat16, still within the bound


def test_a_cell_torch_nn_lacks_runs_against_rnngraph_s_default(capsys):
    assert main(["bench", "--model", "charlm", "--quick", "--cell", "mgu", "-B", "2", "--precision", "fp32",
                 "--impls", "torch,default,staged"]) == 0
    out = capsys.readouterr().out
    assert "skipped torch: torch.nn has no layer for cell mgu" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("mgu ")]
    assert row[-2] == "yes" and row[6] == "-"


def test_losses_that_disagree_are_reported():
    from rnngraph.lab.bench_model import compare, format_model_table
    base = {"model": "charlm", "cell": "lstm", "T": 8, "B": 2, "H": 16, "layers": 2, "precision": "fp32"}
    rows = compare([{**base, "impl": "torch", "ms_per_step": 2.0, "losses": [4.0, 3.9]},
                    {**base, "impl": "graph", "ms_per_step": 1.0, "losses": [4.0, 3.8]}], tf32=False)
    assert rows[1]["losses_agree"] is False and rows[1]["loss_diff"] == pytest.approx(0.1 / 3.9)
    table = format_model_table(rows)
    assert "0.50x" in table and "NO (2.6e-02)" in table


@pytest.mark.parametrize("argv, message", [
    (["--impls", "cudnn"], "unknown implementation cudnn for --model; choose from torch, default, staged, graph"),
    (["--precision", "fp8"], "unknown precision fp8 for --model; choose from fp32, bf16, fp16")])
def test_unknown_options_are_one_line(capsys, argv, message):
    assert main(["bench", "--model", "charlm", "--quick", *argv]) == 2
    assert message in capsys.readouterr().err
