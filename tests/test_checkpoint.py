"""Checkpoints: round trips, atomic writes, and one clear error for every broken file."""
import json
import os
import zipfile

import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.train import checkpoint as ck
from rnngraph.train.charlm import CharLM
from rnngraph.nn.optim import Adam

ARRAYS = {"model/0.weight_ih_l0": np.arange(12, dtype=np.float32).reshape(3, 4),
          "optim/0.bias/exp_avg": np.full(5, 0.1, dtype=np.float64),
          "state/0/1": np.zeros((1, 2, 3), dtype=np.float32)}


@pytest.fixture
def saved(tmp_path):
    return ck.save_checkpoint(tmp_path / "run" / "checkpoint.npz", {"step": 7, "vocab": ["a", "é"]}, ARRAYS)


def test_round_trip_keeps_config_arrays_and_dtypes(saved):
    got = ck.load_checkpoint(saved)
    assert got.config["step"] == 7 and got.config["vocab"] == ["a", "é"]
    assert got.config["format"] == ck.FORMAT and got.config["version"] == ck.VERSION
    assert got.arrays.keys() == ARRAYS.keys()
    for k, a in ARRAYS.items():
        assert got.arrays[k].dtype == a.dtype and np.array_equal(got.arrays[k], a)


def test_file_is_an_ordinary_npz_with_a_json_member(saved):
    with np.load(saved) as z:
        assert np.array_equal(z["model/0.weight_ih_l0"], ARRAYS["model/0.weight_ih_l0"])
    with zipfile.ZipFile(saved) as z:
        assert json.loads(z.read("config.json"))["step"] == 7


def test_interrupted_write_keeps_the_last_good_checkpoint(saved, monkeypatch):
    before = saved.read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt                                   # e.g. Ctrl-C in the middle of the write

    monkeypatch.setattr(np.lib.format, "write_array", crash)
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(saved, {"step": 8}, ARRAYS)
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == ["checkpoint.npz"]        # no temporary file left behind


def test_unwritable_place_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(RnnGraphError, match=r"cannot write checkpoint .*file/c.npz: "):
        ck.save_checkpoint(tmp_path / "file" / "c.npz", {}, ARRAYS)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(RnnGraphError, match=r"checkpoint .*nothing.npz not found"):
        ck.load_checkpoint(tmp_path / "nothing.npz")


def test_truncated_checkpoint(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[:len(data) // 2])
    with pytest.raises(RnnGraphError, match=r"checkpoint .* is truncated or corrupt \(BadZipFile"):
        ck.load_checkpoint(saved)


def test_corrupt_checkpoint(saved):
    data = bytearray(saved.read_bytes())
    i = data.index(b"\x93NUMPY") + 130                            # inside the first array's data
    data[i:i + 8] = b"\xff" * 8
    saved.write_bytes(bytes(data))
    with pytest.raises(RnnGraphError, match=r"is truncated or corrupt \(BadZipFile: Bad CRC-32"):
        ck.load_checkpoint(saved)


def test_files_that_are_not_checkpoints(tmp_path):
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(RnnGraphError, match="truncated or corrupt"):
        ck.load_checkpoint(tmp_path / "text.npz")
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(RnnGraphError, match=r"plain.npz is not an rnngraph checkpoint: it has no config.json"):
        ck.load_checkpoint(tmp_path / "plain.npz")
    ck.save_checkpoint(tmp_path / "future.npz", {"version": 99}, {})
    with pytest.raises(RnnGraphError, match="has format version 99; this rnngraph reads version 1"):
        ck.load_checkpoint(tmp_path / "future.npz")


def test_optimizer_state_round_trips():
    p = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    opt = Adam(p, lr=0.01)
    opt.step({"w": np.full((2, 3), 0.5, np.float32), "b": np.ones(3, np.float32)})
    meta, arrays = ck.pack_optimizer(opt.state_dict())
    meta = json.loads(json.dumps(meta))                           # it goes through JSON in a checkpoint
    other = Adam({k: v.copy() for k, v in p.items()}, lr=0.5)
    other.load_state_dict(ck.unpack_optimizer(meta, arrays))
    assert other.lr == 0.01 and other.state["w"]["step"] == 1
    for name in p:
        for buf in ("exp_avg", "exp_avg_sq"):
            assert np.array_equal(other.state[name][buf], opt.state[name][buf])


def test_stream_states_round_trip():
    h, c, g = np.ones((2, 4, 3)), np.zeros((2, 4, 3)), np.full((1, 4, 5), 2.0)
    meta, arrays = ck.pack_states([(h, c), None, g])
    back = ck.unpack_states(json.loads(json.dumps(meta)), arrays)
    assert isinstance(back[0], tuple) and back[1] is None
    assert np.array_equal(back[0][0], h) and np.array_equal(back[0][1], c) and np.array_equal(back[2], g)


def test_model_weights_round_trip_to_identical_outputs(tmp_path):
    config = {"cell": "gru", "layers": 2, "hidden": 8, "dropout": 0.0, "dtype": "float32", "vocab_size": 5,
              "seed": 3}
    lm = CharLM(config, "numpy")
    ck.save_checkpoint(tmp_path / "m.npz", {"model": config},
                       {f"model/{k}": v for k, v in lm.state_dict().items()})
    got = ck.load_checkpoint(tmp_path / "m.npz")
    other = CharLM({**got.config["model"], "seed": 99}, "numpy")     # different initial weights
    other.load_state_dict(ck.model_arrays(got.arrays))
    ids = np.array([[0, 1], [4, 2], [3, 3]])                          # [T=3, B=2]
    assert np.array_equal(lm.eval()(ids)[0], other.eval()(ids)[0])


def test_check_same_lists_every_difference(tmp_path):
    with pytest.raises(RnnGraphError) as e:
        ck.check_same(tmp_path / "c.npz", {"hidden": 256, "cell": "lstm", "bptt": 64},
                      {"hidden": 128, "cell": "gru", "bptt": 64})
    assert "does not match the requested model: --hidden 128 (the checkpoint has 256); " \
           "--cell gru (the checkpoint has lstm); drop these options" in str(e.value)
