"""Shared test setup: the `gpu` marker, skipped cleanly where no GPU is usable, and a summary line
saying how many comparisons with PyTorch were skipped where torch is not installed."""
import functools

import pytest


@functools.lru_cache(maxsize=None)
def _gpu_problem():
    from rnngraph.run.backends import gpu_problem
    return gpu_problem()


@functools.lru_cache(maxsize=None)
def _gpus() -> int:
    if _gpu_problem():
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a usable CUDA GPU and cupy (skipped otherwise)")
    config.addinivalue_line("markers", "gpus2: needs two or more GPUs (skipped otherwise; run with -m gpu)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and _gpu_problem():
            item.add_marker(pytest.mark.skip(reason=f"no usable GPU: {_gpu_problem()}"))
        elif "gpus2" in item.keywords and _gpus() < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 GPUs, {_gpus()} visible"))


def pytest_terminal_summary(terminalreporter):
    """One line when torch is missing: how many comparisons with PyTorch were skipped, and the fix."""
    from numerics import TORCH_MISSING, torch
    if torch is not None:
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if TORCH_MISSING in str(r.longrepr)]
    modules = [r.nodeid for r in terminalreporter.stats.get("skipped", [])       # pytest.importorskip("torch")
               if r.when == "collect" and "could not import 'torch'" in str(r.longrepr)]
    extra = f", and {', '.join(modules)} as a whole" if modules else ""
    terminalreporter.write_line(f"torch is not installed: {len(skipped)} comparisons with PyTorch were skipped{extra} "
                                "(pip install torch; CPU build: see README)", yellow=True)


@pytest.fixture(scope="session")
def small_text(tmp_path_factory):
    """The bundled corpus's first 12,000 characters (the start of Hamlet) as a file: runs of seconds."""
    from rnngraph.train.data import read_text
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_text()[:12_000])
    return path
