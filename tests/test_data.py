"""The bundled corpus, the vocabulary, the train/validation split and the continuous streams."""
import configparser
from pathlib import Path

import numpy as np
import pytest

from rnngraph import RnnGraphError
from rnngraph.train.data import Vocab, bundled_path, make_streams, read_text, split, validation_streams

ROOT = Path(__file__).resolve().parents[1]


def test_bundled_text_is_1_to_2_mb_of_utf8_with_a_source_note():
    path = bundled_path()
    assert 1_000_000 <= path.stat().st_size <= 2_000_000
    text = read_text()
    assert text.startswith("HAMLET, PRINCE OF DENMARK") and "Twelfth Night" not in text[:1000]
    source = (path.parent / "SOURCE.md").read_text()
    assert "public domain" in source and "shakespeare" in source


def test_package_data_ships_the_text():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    patterns = cfg["options.package_data"]["rnngraph.train"].replace(",", " ").split()
    assert any(bundled_path().relative_to(ROOT / "rnngraph" / "train").match(p) for p in patterns)


def test_vocab_round_trips_and_names_unknown_characters():
    v = Vocab.from_text("to be or not to be")
    assert v.chars == sorted(set("to be or not to be"))
    ids = v.encode("bet or not")
    assert ids.dtype == np.int32 and v.decode(ids) == "bet or not"
    with pytest.raises(RnnGraphError, match=r"characters 'XZ' are not in the model's vocabulary of 7"):
        v.encode("toXbeZ")


def test_split_holds_out_the_end():
    ids = np.arange(100)
    train, val = split(ids, 0.1)
    assert train.tolist() == list(range(90)) and val.tolist() == list(range(90, 100))
    with pytest.raises(RnnGraphError, match="--val-fraction"):
        split(ids, 1.5)


def test_streams_are_continuous_and_chunks_shift_targets_by_one():
    ids = np.arange(1000, dtype=np.int32)
    s = make_streams(ids, streams=4, bptt=10)
    assert s.data.shape == (4, 250) and s.chunks == 24                  # (250 - 1) // 10
    assert s.data[2].tolist() == list(range(500, 750))                  # stream 2 is one piece of the text
    x0, y0 = s.chunk(0)
    x1, _ = s.chunk(1)
    assert x0.shape == y0.shape == (10, 4)                             # time-major [K, S]
    assert (y0 == x0 + 1).all()                                        # targets: the next character
    assert (x1[0] == y0[-1]).all()                                     # chunk 1 continues chunk 0


def test_validation_uses_fewer_streams_when_short():
    s = validation_streams(np.arange(50), streams=64, bptt=8)
    assert s.streams == 5 and s.chunks >= 1


@pytest.mark.parametrize("streams, bptt, message", [
    (4, 1000, r"--bptt 1000 is larger than the data allows: the training text has 900 characters, "
              r"so --bptt can be at most 899"),
    (100, 16, r"--streams 100 is larger than the data allows: the training text has 900 characters, "
              r"enough for at most 52 streams"),
])
def test_too_many_streams_or_too_long_bptt(streams, bptt, message):
    with pytest.raises(RnnGraphError, match=message):
        make_streams(np.arange(900), streams, bptt)


def test_empty_and_whitespace_files_are_refused(tmp_path):
    for name, body in (("empty.txt", b""), ("blank.txt", b" \n\n\t")):
        (tmp_path / name).write_bytes(body)
        with pytest.raises(RnnGraphError, match=rf"text file .*{name} is empty"):
            read_text(tmp_path / name)


def test_non_utf8_file_names_the_byte_and_line(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("first line\nna\u00efve\n".encode("latin-1"))
    with pytest.raises(RnnGraphError, match=r"is not UTF-8: byte 0xef at offset 13 \(line 2\); convert it"):
        read_text(tmp_path / "latin1.txt")


def test_missing_file_and_byte_order_mark(tmp_path):
    with pytest.raises(RnnGraphError, match=r"cannot read text file .*nowhere.txt: No such file"):
        read_text(tmp_path / "nowhere.txt")
    (tmp_path / "bom.txt").write_bytes("\ufeffhello".encode("utf-8"))
    assert read_text(tmp_path / "bom.txt") == "hello"
