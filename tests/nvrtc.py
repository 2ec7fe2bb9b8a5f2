"""NVRTC, the CUDA compiler as a library (the pip wheel nvidia-cuda-nvrtc-cu12, in the test extra): the
generated kernels are compiled on machines without a GPU, so a source that does not compile fails in CI."""
import ctypes
import ctypes.util
import glob
import os

import pytest

from rnngraph.run.backends.cuda.source import complete, options


def _nvrtc():
    """libnvrtc from the nvidia-cuda-nvrtc wheel, else the system's."""
    found = []
    try:
        import nvidia.cuda_nvrtc as wheel
        found = [p for d in wheel.__path__ for p in sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so.*")))
                 if "builtins" not in p and ".alt." not in p]
    except ImportError:
        pass
    path = (found or [ctypes.util.find_library("nvrtc")])[0]
    if path is None:
        pytest.fail("NVRTC not found: pip install nvidia-cuda-nvrtc-cu12 (in the test extra)")
    return ctypes.CDLL(path)


def nvrtc_compile(source: str, name: str):
    """Compiles a generated source (as the cupy backend completes it, with its options) for sm_90; fails the test
    with the compiler's log."""
    lib, prog = _nvrtc(), ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), complete(source).encode(), f"{name}.cu".encode(), 0, None,
                                  None) == 0
    given = [b"-arch=compute_90", b"-default-device", *(o.encode() for o in options(source))]
    rc = lib.nvrtcCompileProgram(prog, len(given), (ctypes.c_char_p * len(given))(*given))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    assert rc == 0, f"{name} does not compile:\n{log.value.decode()}"
