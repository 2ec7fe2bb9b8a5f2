"""Whether cupy and a GPU are usable here, and if not, what is wrong and how to fix it (run.backends.gpu_problem,
`rnngraph doctor`). cupy is imported lazily: any CUDA build of it (cupy-cuda12x, cupy-cuda13x) works."""
from __future__ import annotations


def gpu_problem() -> str | None:
    """None when cupy and a GPU are usable, else one line saying what is wrong and how to fix it."""
    try:
        import cupy
    except Exception as e:
        return f"cupy is not importable ({type(e).__name__}: {e}); install it with pip install 'rnngraph[gpu]'"
    try:
        rt = cupy.cuda.runtime
        driver, runtime = rt.driverGetVersion(), rt.runtimeGetVersion()
    except Exception as e:
        return f"no usable CUDA driver for cupy ({type(e).__name__}: {e}); install the NVIDIA driver"
    if driver == 0:
        return "no NVIDIA driver found (cupy is installed); install the NVIDIA driver, or use backend='numpy'"
    if driver // 1000 < runtime // 1000:   # minor versions are compatible within one major version
        return (f"cupy's CUDA runtime {cuda_version(runtime)} is newer than the driver supports (CUDA {cuda_version(driver)}); "
                f"install the cupy build for CUDA {driver // 1000} (pip install cupy-cuda{driver // 1000}x) "
                "or update the NVIDIA driver")
    try:
        if rt.getDeviceCount() < 1:
            return "cupy sees no GPU; check CUDA_VISIBLE_DEVICES and the driver (nvidia-smi)"
        cupy.zeros(1).sum().item()
    except Exception as e:
        return f"the GPU is not usable ({type(e).__name__}: {e}); check the driver with nvidia-smi"
    return None


def cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"
