"""Shared test setup: the `gpu` marker, skipped cleanly where no GPU is usable."""
import functools

import pytest


@functools.lru_cache(maxsize=None)
def _gpu_problem():
    from rnngraph.backends.cupy_backend import gpu_problem
    return gpu_problem()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a usable CUDA GPU and cupy (skipped otherwise)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and _gpu_problem():
            item.add_marker(pytest.mark.skip(reason=f"no usable GPU: {_gpu_problem()}"))
