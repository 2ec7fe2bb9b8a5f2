"""`rnngraph doctor`: versions, the one-line GPU problem with its fix, and the per-backend self-check."""
import sys
import types

import numpy as np

from rnngraph.lab import doctor
from rnngraph.run.backends.cuda import usable as cupy_backend
from rnngraph.lab.cli import main


def test_doctor_prints_versions_and_passes_without_a_gpu(capsys):
    problem = cupy_backend.gpu_problem()
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in ("python", "numpy", "networkx", "cupy", "torch", "CUDA", "GPU"):
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    assert f"numpy {np.__version__}" in " ".join(out.split())
    assert "numpy  staged  float32  pass" in out and "numpy  staged  float64  pass" in out
    if problem:
        assert out.count(problem) == 1 and f"GPU not usable: {problem}" in out
        assert "cupy   graph   float32  skipped (no usable GPU)" in out
    assert out.rstrip().endswith("doctor: all available checks passed")


def fake_cupy(driver: int, runtime: int):
    """A cupy module whose CUDA runtime and driver report the given versions and see no device."""
    def no_device(*args):
        raise RuntimeError("cudaErrorInsufficientDriver")
    rt = types.SimpleNamespace(driverGetVersion=lambda: driver, runtimeGetVersion=lambda: runtime,
                               getDeviceCount=no_device, getDeviceProperties=no_device)
    return types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(runtime=rt),
                                 get_array_module=lambda *a: np)   # what rnngraph.arrays asks a loaded cupy


def test_cupy_newer_than_the_driver_is_one_line_with_the_fix(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(driver=12020, runtime=13000))
    assert main(["doctor"]) == 0                 # the numpy checks still pass
    lines = capsys.readouterr().out.splitlines()
    bad = [line for line in lines if "driver supports" in line]
    assert bad == ["GPU not usable: cupy's CUDA runtime 13.0 is newer than the driver supports (CUDA 12.2); "
                   "install the cupy build for CUDA 12 (pip install cupy-cuda12x) or update the NVIDIA driver"]
    assert "  cupy      14.2.0" in lines and "  CUDA      runtime 13.0, driver 12.2" in lines
    assert main(["doctor", "--require-gpu"]) == 1
    assert capsys.readouterr().out.rstrip().endswith("doctor: problems found")


def test_doctor_reports_gpu_problem_as_given(monkeypatch, capsys):
    monkeypatch.setattr(cupy_backend, "gpu_problem", lambda: "the driver is too old; update it")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.count("the driver is too old; update it") == 1
    assert out.count("skipped (no usable GPU)") == 4


def test_a_failing_check_exits_1(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "self_check", lambda backend, mode, dtype: 1e-3)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "numpy  staged  float32  FAIL  1.0e-03 (tolerance 1e-04)" in out
    monkeypatch.setattr(doctor, "self_check", lambda *a: 1 / 0)
    assert main(["doctor"]) == 1
    assert "FAIL  ZeroDivisionError: division by zero" in capsys.readouterr().out


def test_self_check_on_numpy_is_tight():
    assert doctor.self_check("numpy", "staged", "float64") < 1e-12
    assert 1e-9 < doctor.self_check("numpy", "staged", "float32") < 1e-5
