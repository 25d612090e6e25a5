"""0360 PB_FAST_ENCODE: the tokenizer's encode without offsets, on the tiny model's tokenizer
(and with 0420 PB_SPLIT_ENCODE, long texts tokenized as pieces; tests/test_split_encode.py has
the cuts on their own).

The ids, masks and type ids must be upstream's for every way the server and library users
call the tokenizer; offsets, when asked for, still come; and the character mappings of an
encoding made without offsets raise instead of answering from zeros."""

import pytest

from .conftest import engine_jobs

pytestmark = pytest.mark.engine

KNOBS = {"off": {}, "on": {"PB_FAST_ENCODE": "1"}, "split": {"PB_FAST_ENCODE": "1", "PB_SPLIT_ENCODE": "1"}}


@pytest.fixture(scope="module")
def jobs(patched_engine, tiny_model):
    with engine_jobs("fast_encode_job.py", patched_engine, tiny_model, runs=KNOBS, timeout=300) as started:
        yield started


@pytest.fixture(scope="module")
def off(jobs):
    return jobs["off"].report()


@pytest.fixture(scope="module")
def on(jobs):
    return jobs["on"].report()


@pytest.fixture(scope="module")
def split(jobs):
    return jobs["split"].report()


def test_ids_and_masks_equal_upstreams_every_way_the_tokenizer_is_called(off, on, split):
    assert on["calls"] == off["calls"]
    assert split["calls"] == off["calls"]
    assert on["chat_tokens"] == off["chat_tokens"] > 3000  # the chat template's long prompt
    assert len(set(map(tuple, off["calls"]["single"]))) == len(off["calls"]["single"])  # the texts differ


def test_split_encode_takes_the_long_texts_and_only_those(off, on, split):
    assert off["split_texts"] == [] and on["split_texts"] == []  # the knob off: one call each
    # the long text three times, and the chat template's prompt that holds it; nothing shorter
    assert len(split["split_texts"]) == 4 and min(split["split_texts"]) >= 8192, split["split_texts"]


def test_offsets_still_come_when_asked_for(off, on):
    assert on["offsets"] == off["offsets"] and on["offsets_have_encodings"] and off["offsets_have_encodings"]
    assert any(end > 0 for _, end in on["offsets"])


def test_character_mappings_raise_instead_of_answering_from_zeroed_offsets(off, on):
    assert off["plain_has_encodings"] and isinstance(off["char_to_token"], int)
    assert not on["plain_has_encodings"]
    assert on["char_to_token"].startswith("error: ") and "not available" in on["char_to_token"]
