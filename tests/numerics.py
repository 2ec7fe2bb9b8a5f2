"""Numerical assertions shared by the layer and loss tests, and torch where it is installed.

`torch` and `F` (torch.nn.functional) are None without torch; tests that compare with PyTorch carry
`@needs_torch` and are skipped then (conftest.py counts them in the summary)."""
import numpy as np
import pytest

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None

TORCH_MISSING = "torch is not installed: this test compares with PyTorch"
needs_torch = pytest.mark.skipif(torch is None, reason=TORCH_MISSING)

RTOL = 1e-10


def close(a, b, rtol=RTOL):
    """Relative closeness to the larger magnitude; asserts."""
    a, b = np.asarray(a), np.asarray(b.detach().numpy() if torch is not None and torch.is_tensor(b) else b)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    assert np.abs(a - b).max(initial=0.0) <= rtol * scale, np.abs(a - b).max() / scale


def directional(f, x, grad, rng, eps=1e-6, rtol=1e-7):
    """Central difference of scalar f along a random direction d equals <grad, d>."""
    d = rng.standard_normal(x.shape)
    fd = (f(x + eps * d) - f(x - eps * d)) / (2 * eps)
    an = float((grad * d).sum())
    assert abs(fd - an) <= rtol * max(1.0, abs(an)), (fd, an)
