"""`rnngraph bench` with the head-wise cells on the CPU: their peers (the hand-written torch eager loop, the same
loop through torch.compile, FlashRNN where it is installed), the heads passed through, and the command."""
import json

import numpy as np
import pytest

from rnngraph import load_cell
from rnngraph.ir.loading import cell_options
from rnngraph.lab import bench
from rnngraph.lab.cli import main

torch = pytest.importorskip("torch")
from rnngraph.lab.references import STEPS, HandWritten, eager_loop  # noqa: E402
from test_bench import assert_same_cell  # noqa: E402


@pytest.mark.parametrize("cell", ["slstm", "mh_lstm"])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_the_hand_written_steps_are_the_same_cells(cell, heads):
    """Against the naive rnngraph run (values, finals and input gradients), with full and head-wise weights."""
    assert cell in STEPS
    assert_same_cell(HandWritten, load_cell(cell, 5, 8, heads=heads))


def test_the_eager_loop_takes_the_hand_written_step():
    cell = load_cell("slstm", 3, 8, heads=2)
    P = {p: torch.rand(s, dtype=torch.float64) for p, s in cell.params.items()}
    assert eager_loop(cell, P).kind == "hand-written"


@pytest.mark.parametrize("impl", ["staged", "torch_eager", "rnngraph_torch"])
def test_measure_passes_the_heads_on(impl):
    r = bench.measure("slstm", impl, T=3, B=2, H=8, repeats=1, warmup=0, cell_options={"heads": 2})
    assert r["cell_options"] == {"heads": 2} and r["train_ms"] > 0, r
    if impl == "torch_eager":
        assert r["eager_loop"] == "hand-written"


def test_measure_torch_compile_of_the_slstm_loop():
    r = bench.measure("slstm", "torch_compile", T=2, B=1, H=4, repeats=1, warmup=0, what=("forward",),
                      cell_options={"heads": 2})
    assert r["forward_ms"] > 0 and r["compile_s"] > 0 and r["eager_loop"] == "hand-written"


@pytest.mark.parametrize("impl", ["flashrnn", "flashrnn_cuda"])
def test_flashrnn_is_skipped_in_one_line_where_it_cannot_run(impl):
    try:
        import flashrnn  # noqa: F401
        here = "needs torch with CUDA" if not torch.cuda.is_available() else None
    except ImportError:
        here = "flashrnn is not installed (pip install flashrnn, on the machine with the GPU)"
    if here is None:
        pytest.skip("FlashRNN runs here: the GPU tests time it")
    for cell in ("slstm", "mh_lstm", "gru"):
        why = bench.measure(cell, impl, T=3, B=1, H=8, repeats=1, warmup=0).get("skipped")
        assert "\n" not in why and why.startswith("FlashRNN has no such cell here" if cell == "gru" else here)
    assert bench.measure("slstm", impl, T=3, B=1, H=8, layers=2, repeats=1, warmup=0)["skipped"].startswith(here)


def test_the_command_takes_heads_for_the_cells_that_take_them(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--cell", "slstm,lstm", "-T", "3", "-B", "1", "-H", "8", "--heads", "2", "--repeats", "1",
                 "--warmup", "1", "--impls", "staged,torch_eager,flashrnn", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    assert {(r["cell"], r["impl"]): r.get("cell_options") for r in rows} == {
        ("slstm", "staged"): {"heads": 2}, ("slstm", "torch_eager"): {"heads": 2}, ("slstm", "flashrnn"): {"heads": 2},
        ("lstm", "staged"): None, ("lstm", "torch_eager"): None, ("lstm", "flashrnn"): None}
    assert "skipped flashrnn for slstm, lstm" in capsys.readouterr().out
    assert cell_options("slstm") == cell_options("mh_lstm") == ("heads",) and cell_options("lstm") == ("proj_size",)
    assert np.isfinite([r["train_ms"] for r in rows if "train_ms" in r]).all()
