"""0420 PB_SPLIT_ENCODE: a long text tokenized as pieces cut at newlines between two non-space
characters gives the ids, masks and special tokens of one call.

Compared here on varied texts (the standard library's sources, whitespace runs, digits, CRLF,
tabs, non-Latin scripts, special tokens written in the text) with the synthetic tokenizer and
with byte-level BPEs whose words come from expressions of the kind GLM's and Llama 3's
tokenizers use, each with a post-processor that adds special tokens. Tokenizers a cut could
change are refused."""

import random
import sysconfig
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from .conftest import engine_module

pytestmark = pytest.mark.engine

# words as GLM's and Llama 3's tokenizers cut them: letters with one leading non-letter, digits in
# threes, punctuation with its trailing newlines, newline runs, other whitespace
WORDS_WIDE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
WORDS_ONE_DIGIT = WORDS_WIDE.replace(r"\p{N}{1,3}", r"\p{N}")  # Qwen's digits, one at a time


def corpus() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(root / name).read_text(encoding="utf-8") for name in ("json/decoder.py", "textwrap.py", "bisect.py")]


def trained(pre, normalizer=None, added=()) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=2000, show_progress=False,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["[gMASK]", "<sop>", "<|user|>", *added])
    tok.post_processor = processors.TemplateProcessing(
        single="[gMASK] <sop> $A", pair="[gMASK] <sop> $A $B",
        special_tokens=[("[gMASK]", tok.token_to_id("[gMASK]")), ("<sop>", tok.token_to_id("<sop>"))])
    return tok


def glm_like(words=WORDS_WIDE, **kwargs) -> Tokenizer:
    return trained(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(words), behavior="isolated"),
                                            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                   **kwargs)


def texts() -> list[str]:
    """Long texts of many kinds, each well past the length where cuts start."""
    rng = random.Random(0)
    sources = corpus()
    pieces = ["x = 1234567 + 89\n", "\r\n", "\n\n\n", "\t\tindent\n", "  trailing  \n", "Ünïcödé ✓ 😀\n",
              "日本語のテキスト\n", "Привет, мир!\n", "<|user|>\nhello", "don't\nwon't\n", "3.14159\n2.71828\n",
              "a\nb\nc\n", ".\n.\n", "word\n  spaced\n", "(\n)\n", "'s\n'll\n"]
    out = ["".join(sources)[:30000], "\n".join(sources)]
    for _ in range(6):
        out.append("".join(rng.choice(pieces + sources[:1] * 2) if rng.random() < 0.05 else rng.choice(pieces)
                           for _ in range(900)))
    return out


@pytest.fixture(scope="module")
def split(patched_engine):
    module = engine_module(patched_engine, "runtime.split_encode")
    # The knob on for these tests, through the knob runtime's own override (`knobs.get` is shared by
    # every engine module loaded in this process: replacing it leaked into later test modules).
    token = module.knobs._request_overrides.set({"PB_SPLIT_ENCODE": True})
    saved = module.PIECES, module.MIN_CHARS, module.PIECE_CHARS
    module.PIECES, module.MIN_CHARS, module.PIECE_CHARS = 8, 4096, 512  # many cuts a text
    yield module
    module.PIECES, module.MIN_CHARS, module.PIECE_CHARS = saved
    module.knobs._request_overrides.reset(token)


TOKENIZERS = {
    "synthetic (GPT-2's byte level)": lambda: __import__("patchbay.runtime.synth", fromlist=["x"]).build_tokenizer()
    .backend_tokenizer,
    "GLM-like, digits in threes": glm_like,
    "Qwen-like, one digit": lambda: glm_like(WORDS_ONE_DIGIT),
    "GLM-like under NFC": lambda: glm_like(normalizer=normalizers.NFC()),
}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_pieces_give_one_calls_ids_and_masks(split, name):
    backend = TOKENIZERS[name]()
    assert split.splittable(backend)
    for text in texts():
        assert len(split.cuts(text, 8)) >= 2  # really cut (indented code has few places to cut)
        for specials in (True, False):
            got = split.encode(backend, [text], specials, False)
            want = backend.encode_batch_fast([text], add_special_tokens=specials)[0]
            assert got is not None and len(got) == 1
            assert got[0].ids == want.ids, (name, specials, text[:80])
            assert got[0].type_ids == want.type_ids and got[0].attention_mask == want.attention_mask
            assert got[0].special_tokens_mask == want.special_tokens_mask


def test_tokenizers_a_cut_could_change_keep_one_call(split):
    text = texts()[0]
    refused = {
        "a prefix space": trained(pre_tokenizers.ByteLevel(add_prefix_space=True)),
        "a metaspace": trained(pre_tokenizers.Metaspace()),
        "lowercasing": trained(pre_tokenizers.ByteLevel(add_prefix_space=False), normalizer=normalizers.Lowercase()),
        "an added token that strips": trained(pre_tokenizers.ByteLevel(add_prefix_space=False),
                                              added=[AddedToken("<mask>", lstrip=True)]),
        "an added newline token": trained(pre_tokenizers.ByteLevel(add_prefix_space=False), added=["\n\n"]),
        "a lookbehind": glm_like(r"(?<=x)y|" + WORDS_WIDE),
    }
    truncating = glm_like()
    truncating.enable_truncation(100)
    refused["truncation set"] = truncating
    for label, backend in refused.items():
        assert not split.splittable(backend), label
        assert split.encode(backend, [text], True, False) is None, label


def test_short_texts_batches_pairs_and_the_knob_off_keep_one_call(split):
    backend = glm_like()
    long = texts()[0]
    assert split.encode(backend, [long[:4000]], True, False) is None  # under MIN_CHARS
    assert split.encode(backend, [long, long], True, False) is None  # a batch: the library spreads it already
    assert split.encode(backend, [(long, long)], True, False) is None  # a pair
    assert split.encode(backend, [long.split()], True, True) is None  # pre-tokenized words
    assert split.encode(backend, ["x" * 20000], True, False) is None  # nowhere to cut
    token = split.knobs._request_overrides.set({"PB_SPLIT_ENCODE": False})
    try:
        assert split.encode(backend, [long], True, False) is None  # the knob off
    finally:
        split.knobs._request_overrides.reset(token)


# 0770 PB_ENCODE_CACHE: the pieces are cut where the text places them and kept, so a text that
# goes on from an earlier one encodes only its new pieces, and gives one call's ids all the same.

@pytest.fixture
def kept(split):
    cache = split.encode_cache
    token = split.knobs._request_overrides.set({"PB_SPLIT_ENCODE": True, "PB_ENCODE_CACHE": True})
    saved = cache.PIECE_CHARS, cache.MAX_CHARS
    cache.PIECE_CHARS = 512
    cache.clear()
    yield split
    cache.PIECE_CHARS, cache.MAX_CHARS = saved
    cache.clear()
    split.knobs._request_overrides.reset(token)


def one_call(backend, text: str):
    return backend.encode_batch_fast([text], add_special_tokens=True)[0]


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_kept_pieces_give_one_calls_ids_resent_grown_and_edited(kept, name):
    backend, cache = TOKENIZERS[name](), kept.encode_cache
    for text in texts():
        got, want = kept.encode(backend, [text], True, False)[0], one_call(backend, text)
        assert got.ids == want.ids and got.special_tokens_mask == want.special_tokens_mask
        assert got.type_ids == want.type_ids and got.attention_mask == want.attention_mask
        without = kept.encode(backend, [text], False, False)[0]  # no special tokens around it
        assert without.ids == backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        held = len(cache._TABLE)
        assert kept.encode(backend, [text], True, False)[0].ids == got.ids  # resent: every piece found
        assert len(cache._TABLE) == held
        grown = text + "\n" + texts()[1][:3000]  # the next turn: the text goes on
        assert cache.cuts(grown, kept.CUT)[:len(cache.cuts(text, kept.CUT))] == cache.cuts(text, kept.CUT)
        assert kept.encode(backend, [grown], True, False)[0].ids == one_call(backend, grown).ids
        assert len(cache._TABLE) - held <= 2 + 3000 // 512  # its old pieces were found
        at = len(text) // 2  # one character changed in the middle: the pieces from there on differ
        edited = text[:at] + ("#" if text[at] != "#" else "%") + text[at + 1:]
        assert kept.encode(backend, [edited], True, False)[0].ids == one_call(backend, edited).ids
        for other in (text, grown, edited, grown + "x\ny" * 700):  # cuts taken from a text seen before
            assert cache.known_cuts(other, kept.CUT) == cache.cuts(other, kept.CUT)


def test_the_table_stays_bounded_and_off_per_request_leaves_it_alone(kept):
    backend, cache = glm_like(), kept.encode_cache
    cache.MAX_CHARS = 20000
    for text in texts():
        assert kept.encode(backend, [text], True, False)[0].ids == one_call(backend, text).ids
        assert 0 < cache._held <= cache.MAX_CHARS
        assert cache._held == sum(len(piece) for _, piece in cache._TABLE)
        assert cache._cut_chars == sum(len(t) for entries in cache._CUTS.values() for t, _ in entries)
        assert len(cache._CUTS) == 1 or cache._cut_chars <= cache.MAX_CHARS
    cache.clear()
    token = kept.knobs._request_overrides.set({"PB_SPLIT_ENCODE": True, "PB_ENCODE_CACHE": False})
    try:
        assert kept.encode(backend, [texts()[0]], True, False)[0].ids == one_call(backend, texts()[0]).ids
        assert not cache._TABLE  # a request with the knob off neither reads nor fills it
    finally:
        kept.knobs._request_overrides.reset(token)
