"""PB_ENCODE_CACHE: the pieces of a long prompt's text that an earlier prompt had are not
tokenized again.

An agent resends its whole conversation every turn, a few hundred new tokens after tens of
thousands it sent before, and the tokenizer reads all of it again before the request can
reach the engine: on one H200's host a resent 37,081-token prompt spent 22-25 ms from its
arrival to the engine's queue, most of it tokenizing, out of a 46-59 ms first token (W41,
W42). Once the prompt's cached blocks and tail are found, that is the largest part left.

With the knob on, 0420's pieces are cut where the text itself says, not at shares of its
length: each cut is the first of 0420's cuts (a newline between two non-space characters) at
least PIECE_CHARS after the one before. A text that goes on from an earlier one is therefore
cut as the earlier one was, up to the earlier one's last cut. Each piece's encoding is kept in
a table bounded by characters (the least recently used goes first), keyed by the piece's text;
a piece found there is not encoded again, the others are encoded on 0420's threads. The pieces
are merged and post-processed as 0420 does. A piece's encoding is the tokenizer's for that
text whenever it is made (0420 takes only tokenizers without dropout), so the ids are those
of one call over the whole text; tests/test_split_encode.py compares them.

Per request: a request that turns it off neither reads nor fills the table.
"""

import threading
from collections import OrderedDict

from .. import knobs

PIECE_CHARS = 4096  # a cut at the first newline this far past the one before
MAX_CHARS = 8_000_000  # characters of pieces kept: about 2M tokens, some 120 MB of encodings

_TABLE: OrderedDict = OrderedDict()  # (id(backend), piece) -> its encoding, the least recently used first
_LOCK = threading.Lock()
_held = 0  # characters of the pieces in _TABLE


def on() -> bool:
    return bool(knobs.get("PB_ENCODE_CACHE"))


def cuts(text: str, cut) -> list[int]:
    """The cut positions: each the end of the first match of `cut` at least PIECE_CHARS after
    the one before (the text's start for the first). Depends only on the text up to a cut and
    the character after it."""
    found, start = [], 0
    while True:
        match = cut.search(text, start + PIECE_CHARS)
        if match is None:
            return found
        start = match.end()
        found.append(start)


def parts(backend, pieces: list[str], encode) -> list:
    """The encodings of `pieces` (without special tokens): from the table where it has them,
    the rest from `encode(pieces) -> encodings`, which are then kept."""
    global _held
    owner = id(backend)  # 0420's table of tokenizers holds the backend: its id stays its own
    found, missing = [None] * len(pieces), []
    with _LOCK:
        for i, piece in enumerate(pieces):
            encoding = _TABLE.get((owner, piece))
            if encoding is None:
                missing.append(i)
            else:
                _TABLE.move_to_end((owner, piece))
                found[i] = encoding
    if missing:
        made = encode([pieces[i] for i in missing])
        with _LOCK:
            for i, encoding in zip(missing, made):
                found[i] = encoding
                key = (owner, pieces[i])
                if key not in _TABLE:
                    _held += len(pieces[i])
                _TABLE[key] = encoding
            while _held > MAX_CHARS and _TABLE:
                (_, piece), _ = _TABLE.popitem(last=False)
                _held -= len(piece)
    return found


def clear() -> None:
    """Forget every kept piece (tests)."""
    global _held
    with _LOCK:
        _TABLE.clear()
        _held = 0
