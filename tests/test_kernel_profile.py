"""experiments/kernel_profile.py's reading of Nsight Compute's CSV (the GPU run itself is a probe)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "kernel_profile.py"


def _script():
    spec = importlib.util.spec_from_file_location("kernel_profile", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kernel_times_sum_each_kernel_over_its_launches(tmp_path):
    mod = _script()
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


def test_stall_regions_group_lines_executed_equally_often(tmp_path, capsys):
    """ncu's source page: per kernel a header line, then SASS lines; a region is a run of lines executed as often."""
    head = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
            '"stall_barrier","stall_long_sb","stall_long_sb (Not Issued)"\n')
    lines = ['"0x10","LDG.E.U16 R12, desc[UR6][R12.64]","2","96","","1","1"',
             '"0x20","SHF.L.U32 R8, R12, 0x10, RZ","40","96","","40","39"',
             '"0x30","BAR.SYNC.DEFER_BLOCKING 0x0","5","384","5","",""',
             '"0x40","@!P0  BRA 0x10","53","384","50","",""',
             '"0x50","FFMA R1, R2, R3, R1","0","384","","",""']
    path = tmp_path / "sass.csv"
    path.write_text('"Kernel Name","rg_persist_a",\n' + head + "\n".join(lines[:2]) + "\n"
                    '"Kernel Name","rg_persist_b",\n' + head + "\n".join(lines[2:]) + "\n")
    mod = _script()
    kernels = mod.stall_regions(path)
    a, b = kernels["rg_persist_a"], kernels["rg_persist_b"]
    assert [(g["address"], g["lines"], g["executed"], g["samples"]) for g in a] == [("0x10", 2, 96, 42)]
    assert dict(a[0]["stalls"]) == {"long_sb": 41} and dict(a[0]["mix"]) == {"ldg": 1}
    assert [(g["lines"], g["samples"], dict(g["stalls"]), dict(g["mix"])) for g in b] == \
        [(3, 58, {"barrier": 55}, {"bar": 1, "fma": 1})]
    mod.summarise_stalls(path)
    out = capsys.readouterr().out
    assert "rg_persist_a: 42 samples; long_sb 98%" in out and "rg_persist_b: 58 samples; barrier 95%" in out
