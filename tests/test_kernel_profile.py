"""experiments/kernel_profile.py's reading of Nsight Compute's CSV (the GPU run itself is a probe)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "kernel_profile.py"


def test_kernel_times_sum_each_kernel_over_its_launches(tmp_path):
    spec = importlib.util.spec_from_file_location("kernel_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    csv = tmp_path / "ncu.csv"
    head = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
    rows = ['"0","rg_scan_bwd_out_float","gpu__time_duration.sum","us","19.04"',
            '"1","rg_pgrad_84962e35c102","gpu__time_duration.sum","ns","7,200"',
            '"2","rg_pgrad_84962e35c102","gpu__time_duration.sum","ns","7,232"',
            '"3","sm80_xmma_gemm","gpu__time_duration.sum","ms","0.1302"']
    csv.write_text("==PROF== Connected to process 1\n" + head + "\n".join(rows) + "\n==PROF== Disconnected\n")
    times = mod.kernel_times(csv)
    assert [(name, n) for name, n, _ in times] == [("sm80_xmma_gemm", 1), ("rg_scan_bwd_out_float", 1),
                                                    ("rg_pgrad_84962e35c102", 2)]
    assert [round(us, 3) for *_, us in times] == [130.2, 19.04, 14.432]
