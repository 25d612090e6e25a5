"""The committed tree stays small enough to go to the device with the wheels a job needs, and a
window kept as raw.jsonl.gz reads as the plain one does."""

import gzip
import json

from patchbay import ROOT
from patchbay.device.gpu import CARRY_LIMIT, CARRY_MARGIN, carry_report, tree_bytes
from patchbay.measure import windows

MIB = 2**20
# `python -m patchbay.device wheels --patched-only --no-tests` gathered 23.3 MiB (build
# pb-a6801bf4a061); the patched engine wheel grows a little with the series.
WHEELS = 25 * MIB


def test_the_tree_leaves_room_for_the_device_wheels():
    tree = tree_bytes(ROOT)
    assert tree + WHEELS <= CARRY_LIMIT - CARRY_MARGIN, (
        f"the tree is {tree / MIB:.1f} MiB: with {WHEELS / MIB:.0f} MiB of wheels a device call would be "
        "refused; commit large raw.jsonl files as raw.jsonl.gz (gzip -9n)")


def test_carry_report_says_when_a_carry_does_not_fit(tmp_path):
    big = tmp_path / "big.whl"
    big.write_bytes(b"\0" * (CARRY_LIMIT - tree_bytes(ROOT) - CARRY_MARGIN + 1))
    assert "too close to the limit" in carry_report(ROOT, [big])
    small = tmp_path / "small.whl"
    small.write_bytes(b"\0" * 1024)
    assert carry_report(ROOT, [small]).endswith(": fits")


def test_a_gzipped_window_reads_as_the_plain_one(tmp_path):
    records = [{"arm": "A", "mode": "greedy", "text": "é\n\"x\""}, {"arm": "B", "n": 2}]
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir()
    packed.mkdir()
    windows.append_raw(plain, records)
    (packed / "raw.jsonl.gz").write_bytes(gzip.compress((plain / "raw.jsonl").read_bytes()))
    assert windows.read_raw(packed) == windows.read_raw(plain) == json.loads(json.dumps(records))
    assert windows.read_raw(tmp_path) == []
