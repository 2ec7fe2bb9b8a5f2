"""Text data for character-level training: the bundled corpus, a character vocabulary, the train/validation
split and the S continuous streams that truncated BPTT walks through in chunks of K frames.

A text of N characters becomes ids [N]; its training part is cut into S streams [S, n] laid side by side
(stream s is characters s·n .. s·n+n-1), and chunk k of an epoch is the K frames from k·K, time-major:
inputs [K, S] and targets [K, S] (the same frames shifted by one character).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import RnnGraphError

BUNDLED = "shakespeare.txt"   # rnngraph/train/corpus/; see SOURCE.md there
BINARY_SHARE = 0.1            # a file with more control characters than this share of its start is not text


def bundled_path() -> Path:
    """Path of the bundled public-domain text (twelve Shakespeare plays, 1.6 MB)."""
    return Path(str(resources.files("rnngraph.train") / "corpus" / BUNDLED))


def read_text(path=None) -> str:
    """The UTF-8 text at `path` (the bundled text when None); a clear RnnGraphError if it is missing,
    unreadable, empty, binary or not UTF-8 (with an iconv command that converts it: UTF-16 and UTF-32 are
    recognised).

    >>> text = read_text()            # the bundled corpus, 1,588,272 characters
    """
    path = bundled_path() if path is None else Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise RnnGraphError(f"cannot read text file {path}: {e.strerror or e}") from None
    text = _decode(path, raw)
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise RnnGraphError(f"text file {path} is empty; give a UTF-8 text of at least a few kilobytes")
    return text


def _decode(path: Path, raw: bytes) -> str:
    """raw as UTF-8 text, or one line: binary data, or the encoding it is in and how to convert it."""
    binary = RnnGraphError(f"text file {path} is binary data, not text; give a UTF-8 text file (plain text, "
                           "a few kilobytes at least)")
    wide = _wide_encoding(raw)
    if wide:
        try:
            looks_binary = _binary(raw.decode(wide))
        except UnicodeDecodeError:
            looks_binary = True
        if looks_binary:
            raise binary
        raise RnnGraphError(f"text file {path} is {wide}, not UTF-8; convert it first, e.g. iconv -f {wide} -t utf-8 "
                            f"{path} > {path.stem}-utf8.txt")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if _binary(raw.decode("latin-1")):
            raise binary from None
        line = raw[:e.start].count(b"\n") + 1
        raise RnnGraphError(f"text file {path} is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} "
                            f"(line {line}); convert it first, e.g. iconv -f latin1 -t utf-8") from None
    if _binary(text):
        raise binary
    return text


def _binary(text: str) -> bool:
    """Whether more than BINARY_SHARE of the first 4,096 characters are control characters (C0 other than tab,
    newline, carriage return and form feed, DEL, C1): what text has hardly any and binary data has plenty of."""
    head = text[:4096]
    controls = sum(1 for ch in head if (ch < " " and ch not in "\t\n\r\f") or "\x7f" <= ch <= "\x9f")
    return controls > BINARY_SHARE * len(head)


def _wide_encoding(raw: bytes) -> str | None:
    """iconv's name for raw's encoding when it is UTF-16 or UTF-32: by its byte-order mark, or, lacking
    one, when a quarter or more of its first 4 KB are NUL bytes (their position tells the byte order)."""
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    head = raw[:4096]
    if not head or head.count(0) * 4 < len(head):
        return None
    width = "utf-32" if head.count(0) * 3 >= len(head) * 2 else "utf-16"
    return width + ("be" if head[0] == 0 else "le")


def text_digest(text: str) -> str:
    """sha256 of the text's UTF-8 bytes: a checkpoint records it so a resume reads the same data."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Vocab:
    """The sorted distinct characters of a text; ids are positions in that list.

    >>> v = Vocab.from_text("hello")
    >>> v.decode(v.encode("hole"))
    'hole'
    """

    def __init__(self, chars):
        self.chars = list(chars)
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        if len(self.index) != len(self.chars) or not self.chars:
            raise RnnGraphError("a vocabulary needs distinct characters, at least one")

    @classmethod
    def from_text(cls, text: str) -> "Vocab":
        return cls(sorted(set(text)))

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:   # -> ids [len(text)] int32
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise RnnGraphError(f"characters {''.join(unknown)!r} are not in the model's vocabulary of "
                                f"{len(self)} characters; use only characters of its training text")
        return np.fromiter((self.index[ch] for ch in text), dtype=np.int32, count=len(text))

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def split(ids: np.ndarray, val_fraction: float):
    """(train, val): the last `val_fraction` of ids [N] is the validation part."""
    if not 0 < val_fraction < 1:
        raise RnnGraphError(f"--val-fraction must lie in (0, 1), got {val_fraction}")
    n_val = max(1, int(round(len(ids) * val_fraction)))
    return ids[:-n_val], ids[-n_val:]


@dataclass(frozen=True)
class Streams:
    """ids cut into S continuous streams, walked in chunks of K frames.

    data: [S, n] with n = len(ids) // S; chunk k reads frames k·K .. k·K+K (K inputs, K shifted targets),
    so there are (n - 1) // K chunks per epoch.
    """
    data: np.ndarray   # [S, n] int32
    bptt: int          # K

    @property
    def streams(self) -> int:
        return self.data.shape[0]

    @property
    def chunks(self) -> int:
        return (self.data.shape[1] - 1) // self.bptt

    def part(self, which: slice) -> "Streams":
        """Streams `which` of these (a rank's share), walked in the same chunks."""
        return Streams(np.ascontiguousarray(self.data[which]), self.bptt)

    def chunk(self, k: int):
        """Chunk k as (inputs [K, S], targets [K, S]), time-major."""
        t0 = k * self.bptt
        window = self.data[:, t0:t0 + self.bptt + 1].T   # [K+1, S]
        return window[:-1], window[1:]


def make_streams(ids: np.ndarray, streams: int, bptt: int, what: str = "training",
                 longer: str = "a longer text") -> Streams:
    """Cuts ids [N] into `streams` continuous streams for chunks of `bptt` frames; a clear error when
    the text is too short for that many streams of at least bptt + 1 characters (`longer` says how to
    get more text)."""
    n = len(ids)
    if n < 2:
        raise RnnGraphError(f"the {what} text is too short: it has {n} character(s) and even --bptt 1 needs 2; "
                            f"use {longer}")
    if bptt + 1 > n:
        raise RnnGraphError(f"--bptt {bptt} is larger than the data allows: the {what} text has {n} "
                            f"characters, so --bptt can be at most {n - 1}; use a smaller --bptt or {longer}")
    if streams * (bptt + 1) > n:
        fix = f"fewer streams, a smaller --bptt or {longer}" if bptt > 1 else f"fewer --streams or {longer}"
        raise RnnGraphError(f"--streams {streams} is larger than the data allows: the {what} text has {n} "
                            f"characters, enough for at most {n // (bptt + 1)} streams of --bptt {bptt} + 1 "
                            f"characters; use {fix}")
    per = n // streams
    return Streams(np.ascontiguousarray(ids[:streams * per].reshape(streams, per)), bptt)


def validation_streams(ids: np.ndarray, streams: int, bptt: int) -> Streams:
    """The validation part as up to `streams` streams (fewer when it is short), chunks of `bptt` frames."""
    return make_streams(ids, max(1, min(streams, len(ids) // (bptt + 1))), bptt, "validation",
                        "a larger --val-fraction or a longer text")
