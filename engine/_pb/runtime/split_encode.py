"""PB_SPLIT_ENCODE: a long prompt's text tokenized as pieces in parallel, with the ids of one call.

The chat template's rendered prompt is tokenized by one call of the Rust tokenizer, on one core,
before the step that reads it can start: for an 8K-token prompt, 7-12 ms on this project's 2-core
machine with the synthetic tokenizer, most of it the pre-tokenizer's regular expression. That
time is part of every cold prompt's time to first token.

Here a text of at least MIN_CHARS characters is cut at up to PIECES - 1 newlines that stand
between two non-space characters, the pieces are encoded on a thread pool of this module's own
(the library releases the GIL while it encodes; its own batch parallelism is off where
TOKENIZERS_PARALLELISM=false, as this project's launcher sets it), joined with `Encoding.merge`,
and post-processed once (the special tokens added as for the whole text). A cut there changes no token: the tokenizers this
accepts split words with a regular expression (GPT-2's byte-level one, or a `Split` before a
byte-level step without one, as GLM, Qwen and Llama 3 use), none of whose alternatives runs past
such a newline or starts a word with it, and none of them looks behind. Other tokenizers (a
normalizer other than NFC, a prefix space, a SentencePiece-style metaspace, BPE dropout, added
tokens that strip whitespace or hold a newline, truncation or padding set) keep the single call.
tests/test_split_encode.py compares the two on varied texts with the synthetic tokenizer and
with others built like GLM's and Llama 3's.
"""

import json
import os
import re
import threading

from .. import knobs
from . import encode_cache

MIN_CHARS = 8192  # shorter texts take one call: a cut would save less than it costs
PIECE_CHARS = 4096  # a piece is at least about this long
PIECES = max(1, min(8, os.cpu_count() or 1))
CUT = re.compile(r"(?<=\S)\n(?=\S)")
_SPLITTABLE: dict[int, tuple] = {}  # id(backend) -> (backend, whether cuts change no token)
_POOL = None  # the encoding threads, made at the first long text
_POOL_LOCK = threading.Lock()


def _pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(PIECES, thread_name_prefix="pb-split-encode")
        return _POOL


def splittable(backend) -> bool:
    """Whether cutting this tokenizer's text at CUT changes no token (see the module's note)."""
    key = id(backend)
    if key not in _SPLITTABLE:  # the entry holds the backend: its id cannot pass to another object
        try:
            _SPLITTABLE[key] = (backend, _check(json.loads(backend.to_str()), backend))
        except Exception:  # noqa: BLE001 - a tokenizer this cannot read keeps the single call
            _SPLITTABLE[key] = (backend, False)
    return _SPLITTABLE[key][1]


def _check(state: dict, backend) -> bool:
    if backend.truncation is not None or backend.padding is not None:
        return False
    normalizer = state.get("normalizer")
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    model = state.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") not in (None, 0.0):
        return False
    for token in state.get("added_tokens") or []:
        if token.get("lstrip") or token.get("rstrip") or "\n" in token.get("content", ""):
            return False
    pre = state.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1:  # GPT-2's byte-level pre-tokenizer with its own expression
        step = steps[0]
        return step.get("type") == "ByteLevel" and step.get("use_regex", True) and not step.get("add_prefix_space")
    if len(steps) == 2:  # an expression of its own, then the byte-level step without one
        split, byte_level = steps
        pattern = (split.get("pattern") or {}).get("Regex") or ""
        return (split.get("type") == "Split" and split.get("behavior") == "Isolated" and not split.get("invert")
                and pattern != "" and "(?<" not in pattern and "^" not in pattern.replace("[^", "")
                and "$" not in pattern and byte_level.get("type") == "ByteLevel"
                and not byte_level.get("use_regex", True) and not byte_level.get("add_prefix_space"))
    return False


def cuts(text: str, pieces: int) -> list[int]:
    """Up to pieces - 1 cut positions, each the first CUT at or after an even share of the text."""
    found, start = [], 0
    for i in range(1, pieces):
        match = CUT.search(text, max(start, len(text) * i // pieces))
        if match is None:
            break
        if match.end() - start >= PIECE_CHARS // 2:
            found.append(match.end())
            start = match.end()
    return found


def encode(backend, texts, add_special_tokens: bool, is_pretokenized: bool):
    """The encodings of `texts` with long ones tokenized as pieces, or None where one call applies
    (knob off, more than one text, pairs or pre-tokenized input, a short text, a tokenizer whose
    words a cut could change, or a tokenizers library without the calls this needs)."""
    if (not knobs.get("PB_SPLIT_ENCODE") or is_pretokenized or len(texts) != 1 or not isinstance(texts[0], str)
            or len(texts[0]) < MIN_CHARS or PIECES < 2 or not hasattr(backend, "post_process")):
        return None
    text = texts[0]
    # the check is kept per tokenizer; truncation or padding may be set on it since
    if not splittable(backend) or backend.truncation is not None or backend.padding is not None:
        return None
    framing = encode_cache.frame(backend, add_special_tokens) if encode_cache.on() else None
    if framing is not None:  # PB_ENCODE_CACHE (0770): cuts the text itself places, pieces' ids kept
        at = encode_cache.known_cuts(text, CUT)
        if not at:
            return None
        parts = encode_cache.parts(backend, _pieces(text, at), lambda new: _encode(backend, new))
        return [encode_cache.join(framing, parts)]
    at = cuts(text, min(PIECES, len(text) // PIECE_CHARS))
    if not at:
        return None
    from tokenizers import Encoding

    parts = _encode(backend, _pieces(text, at))
    return [backend.post_process(Encoding.merge(parts, growing_offsets=True), None, add_special_tokens)]


def _pieces(text: str, at: list[int]) -> list[str]:
    bounds = [0, *at, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _encode(backend, pieces: list[str]) -> list:
    """Each piece's encoding without special tokens, on the pool's threads (one piece here)."""
    if len(pieces) == 1:  # a resent text's new piece: a thread's round trip costs more than it saves
        return backend.encode_batch_fast(pieces, add_special_tokens=False)
    pool = _pool()
    jobs = [pool.submit(backend.encode_batch_fast, [piece], add_special_tokens=False) for piece in pieces]
    return [job.result()[0] for job in jobs]
