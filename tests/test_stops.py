"""The stop-string cutter chat replies and legacy completions share (api/stops.py)."""

import pytest

from .conftest import engine_module

pytestmark = pytest.mark.build


@pytest.fixture(scope="module")
def stops(patched_engine):
    return engine_module(patched_engine, "api.stops")


def run(cutter, pieces) -> str:
    out = ""
    for piece in pieces:
        out += cutter.feed(piece)
        if cutter.stopped:
            break
    return out + cutter.flush()


def test_a_stop_string_split_across_pieces_ends_the_text_before_it(stops):
    assert run(stops.StopCutter(["END"]), ["abc E", "N", "D more"]) == "abc "
    assert run(stops.StopCutter(["END"], keep_stop=True), ["abc E", "N", "D more"]) == "abc END"


def test_the_earliest_stop_wins_whatever_the_order_given(stops):
    assert run(stops.StopCutter(["zz", "b"]), ["a", "bzz"]) == "a"
    assert run(stops.StopCutter(["b", "zz"]), ["azz", "b"]) == "a"
    assert run(stops.StopCutter(["ab", "abc"], keep_stop=True), ["xabcd"]) == "xabc"  # at one place: the longer


def test_text_is_held_only_while_a_stop_string_may_begin_in_it(stops):
    cutter = stops.StopCutter(["long stop"])
    assert cutter.feed("0123456789") == "01"  # the last 8 characters could begin "long stop"
    assert cutter.held == "23456789" and not cutter.stopped
    assert cutter.flush() == "23456789"
    assert run(stops.StopCutter([]), ["a", "b"]) == "ab"  # no stops: nothing held
