"""Every generated CUDA source stays byte for byte what it was: moving or reshaping the generators changes
no kernel the GPU compiles (tests/kernel_census.py lists them; kernel_sources.json holds their digests)."""
import json

from kernel_census import STORED, census


def test_every_generated_source_is_unchanged():
    want, got = json.loads(STORED.read_text()), census()
    changed = sorted(k for k in want.keys() & got.keys() if want[k] != got[k])
    assert not changed and want.keys() == got.keys(), (
        f"changed: {changed[:10]}; new: {sorted(got.keys() - want.keys())[:10]}; "
        f"gone: {sorted(want.keys() - got.keys())[:10]} (python tests/kernel_census.py --write, where meant)")
