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
cut as the earlier one was, up to the earlier one's last cut. Each piece's token ids are kept
in a table bounded by characters (the least recently used goes first), keyed by the piece's
text; a piece found there is not encoded again, the others are encoded on 0420's threads. A
piece's encoding is the tokenizer's for that text whenever it is made (0420 takes only
tokenizers without dropout), so the ids are those of one call over the whole text;
tests/test_split_encode.py compares them.

What is left once every piece is found is kept small too (W43: 13-16 ms of a resent 32K
prompt's admission went to merging the pieces' encodings, post-processing them and converting
the result to lists):
- the cuts: the last texts' cuts are kept (up to four texts for each of CUT_TEXTS first
  PIECE_CHARS characters, MAX_CHARS characters of texts in all); a text that starts as one of
  them did, up to that one's last cut and the character after it, takes those cuts and looks
  for cuts only past them;
- the ids: the pieces' ids are joined as arrays, between the special tokens the tokenizer's
  post-processor puts before and after a text (read once per tokenizer from a sample), and
  handed over as an `Encoding`-like object with the ids, masks and type ids the caller reads.
  A post-processor that does more than add fixed tokens around the text (any but a template,
  GPT-2's byte-level one, BERT's or RoBERTa's, or a sequence of those), or a sample it does
  not frame as expected, keeps 0420's merge and post-processing, without the table.

Per request: a request that turns it off neither reads nor fills the table.
"""

import json
import threading
from array import array
from collections import OrderedDict

from .. import knobs

# a cut at the first newline this far past the one before: a resent text's last piece and its new
# text are encoded again, so short pieces (a 32K-token turn's encoding 1.8 -> 0.9 ms at 4096 -> 1024
# on a 2-core CPU, a cold 34K-token text no slower)
PIECE_CHARS = 1024
MAX_CHARS = 8_000_000  # characters of pieces kept: about 2M tokens, some 8 MB of ids
CUT_TEXTS = 64  # starts of texts whose cuts are kept (four texts each, MAX_CHARS of them in all)
FRAMING = {"TemplateProcessing", "ByteLevel", "RobertaProcessing", "BertProcessing"}  # fixed tokens around
SAMPLE = "frame the\nsample"  # a text the post-processor frames, to find what it adds

_TABLE: OrderedDict = OrderedDict()  # (id(backend), piece) -> its ids (array), the least recently used first
_CUTS: OrderedDict = OrderedDict()  # a text's first PIECE_CHARS characters -> [(text, its cuts)], newest last
_FRAMES: dict = {}  # (id(backend), add_special_tokens) -> (backend, Frame or None)
_LOCK = threading.Lock()
_held = 0  # characters of the pieces in _TABLE
_cut_chars = 0  # characters of the texts in _CUTS


def on() -> bool:
    return bool(knobs.get("PB_ENCODE_CACHE"))


def cuts(text: str, cut, start: int = 0, found: list[int] | None = None) -> list[int]:
    """The cut positions: each the end of the first match of `cut` at least PIECE_CHARS after
    the one before (`start` for the first, after the cuts `found` already). Depends only on the
    text up to a cut and the character after it."""
    found = list(found or [])
    while True:
        match = cut.search(text, start + PIECE_CHARS)
        if match is None:
            return found
        start = match.end()
        found.append(start)


def known_cuts(text: str, cut) -> list[int]:
    """`cuts(text, cut)`, taking an earlier text's cuts where this one starts as it did."""
    global _cut_chars
    key = text[:PIECE_CHARS]
    with _LOCK:
        earlier = list(_CUTS.get(key, ()))
    found: list[int] = []
    for other, other_cuts in reversed(earlier):
        if other_cuts and len(text) > other_cuts[-1] and text.startswith(other[:other_cuts[-1] + 1]):
            found = other_cuts
            break
    at = cuts(text, cut, found[-1], found) if found else cuts(text, cut)
    with _LOCK:
        entries = _CUTS.pop(key, [])
        _cut_chars -= sum(len(t) for t, _ in entries)
        entries = [(t, c) for t, c in entries if t is not text][-3:] + [(text, at)]
        _CUTS[key] = entries
        _cut_chars += sum(len(t) for t, _ in entries)
        while len(_CUTS) > 1 and (len(_CUTS) > CUT_TEXTS or _cut_chars > MAX_CHARS):
            _, gone = _CUTS.popitem(last=False)
            _cut_chars -= sum(len(t) for t, _ in gone)
    return at


def parts(backend, pieces: list[str], encode) -> list:
    """The ids (arrays) of `pieces` without special tokens: from the table where it has them,
    the rest from `encode(pieces) -> encodings`, which are then kept."""
    global _held
    owner = id(backend)  # 0420's table of tokenizers holds the backend: its id stays its own
    found, missing = [None] * len(pieces), []
    with _LOCK:
        for i, piece in enumerate(pieces):
            ids = _TABLE.get((owner, piece))
            if ids is None:
                missing.append(i)
            else:
                _TABLE.move_to_end((owner, piece))
                found[i] = ids
    if missing:
        made = encode([pieces[i] for i in missing])
        with _LOCK:
            for i, encoding in zip(missing, made):
                found[i] = array("I", encoding.ids)
                key = (owner, pieces[i])
                if key not in _TABLE:
                    _held += len(pieces[i])
                _TABLE[key] = found[i]
            while _held > MAX_CHARS and _TABLE:
                (_, piece), _ = _TABLE.popitem(last=False)
                _held -= len(piece)
    return found


class Frame:
    """What a tokenizer's post-processor puts around a text: tokens before and after it, their
    type ids and special-token marks, and the text's own type id."""

    def __init__(self, before, after, types_before, types_after, text_type, marks_before, marks_after):
        self.before, self.after = array("I", before), array("I", after)
        self.types_before, self.types_after, self.text_type = types_before, types_after, text_type
        self.marks_before, self.marks_after = marks_before, marks_after


def frame(backend, add_special_tokens: bool) -> Frame | None:
    """The tokenizer's frame (None where its post-processor does more than add fixed tokens)."""
    key = (id(backend), add_special_tokens)
    if key not in _FRAMES:  # the entry holds the backend: its id cannot pass to another object
        try:
            _FRAMES[key] = (backend, _frame_of(backend, add_special_tokens))
        except Exception:  # noqa: BLE001 - a tokenizer this cannot read keeps 0420's merge
            _FRAMES[key] = (backend, None)
    return _FRAMES[key][1]


def _frame_of(backend, add_special_tokens: bool) -> Frame | None:
    from tokenizers import Encoding

    processor = json.loads(backend.to_str()).get("post_processor")
    steps = (processor or {}).get("processors", []) if (processor or {}).get("type") == "Sequence" else [processor]
    if not all(step is None or step.get("type") in FRAMING for step in steps):
        return None
    piece = backend.encode_batch_fast([SAMPLE], add_special_tokens=False)[0]
    whole = backend.post_process(Encoding.merge([piece], growing_offsets=True), None, add_special_tokens)
    ids, inner = whole.ids, piece.ids
    starts = [i for i in range(len(ids) - len(inner) + 1) if ids[i:i + len(inner)] == inner]
    if len(starts) != 1 or not inner:
        return None
    i, j = starts[0], starts[0] + len(inner)
    types, marks = whole.type_ids, whole.special_tokens_mask
    if len(set(types[i:j])) != 1 or any(marks[i:j]) or whole.attention_mask != [1] * len(ids):
        return None
    return Frame(ids[:i], ids[j:], types[:i], types[j:], types[i], marks[:i], marks[j:])


class Ids:
    """The joined ids as the caller of an `Encoding` reads them (ids, attention mask, type ids,
    special-token marks; no offsets, which 0360's callers do not ask for)."""

    overflowing: list = []

    def __init__(self, ids: list[int], text_len: int, framing: Frame):
        self.ids, self._text_len, self._frame = ids, text_len, framing

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def attention_mask(self) -> list[int]:
        return [1] * len(self.ids)

    @property
    def type_ids(self) -> list[int]:
        f = self._frame
        return f.types_before + [f.text_type] * self._text_len + f.types_after

    @property
    def special_tokens_mask(self) -> list[int]:
        f = self._frame
        return f.marks_before + [0] * self._text_len + f.marks_after


def join(framing: Frame, arrays: list) -> Ids:
    """The pieces' ids between the frame's tokens."""
    ids = array("I", framing.before)
    for piece in arrays:
        ids.extend(piece)
    text_len = len(ids) - len(framing.before)
    ids.extend(framing.after)
    return Ids(ids.tolist(), text_len, framing)


def clear() -> None:
    """Forget every kept piece and cut (tests)."""
    global _held, _cut_chars
    with _LOCK:
        _TABLE.clear()
        _CUTS.clear()
        _held = _cut_chars = 0
