"""rnngraph.torch in bfloat16 and float16 on the CPU: the numpy reference's half precision (storage in half,
float32 arithmetic) through autograd; bfloat16 tensors cross as the same bits, without a copy."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ml_dtypes")

TOL = {torch.bfloat16: 3e-2, torch.float16: 5e-3}       # relative 2-norm against float64, as tests/test_half.py


def rel(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_lstm_is_close_to_torch_in_float64(dtype):
    import rnngraph.torch as rt
    torch.manual_seed(0)
    ours = rt.LSTM(3, 8, num_layers=2, bidirectional=True).to(dtype)
    ref = torch.nn.LSTM(3, 8, num_layers=2, bidirectional=True).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(10, 4, 3).to(dtype).requires_grad_()
    y, (h, c) = ours(x)
    assert y.dtype == h.dtype == dtype
    (y.float().pow(2).sum() + h.float().sum()).backward()
    xr = x.detach().double().requires_grad_()
    yr, (hr, _) = ref(xr)
    (yr.pow(2).sum() + hr.sum()).backward()
    pairs = [(y, yr), (h, hr), (x.grad, xr.grad)] + list(zip((p.grad for p in ours.parameters()),
                                                             (p.grad for p in ref.parameters())))
    assert all(rel(a, b) <= TOL[dtype] for a, b in pairs)


def test_bfloat16_views_share_memory_both_ways():
    from rnngraph.torch.autograd import to_array, to_tensor
    t = torch.arange(6.0).to(torch.bfloat16)
    a = to_array(t)
    assert a.dtype.name == "bfloat16" and a.ctypes.data == t.data_ptr()
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())
    back = to_tensor(a, t.device)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()


def test_other_dtypes_are_one_clear_error():
    import rnngraph.torch as rt
    from rnngraph import RnnGraphError
    m = rt.GRU(3, 4)
    with pytest.raises(RnnGraphError, match="runs float32, float64, bfloat16 and float16 tensors"):
        m(torch.zeros(2, 1, 3, dtype=torch.int32))
