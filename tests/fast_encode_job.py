"""Run by tests/test_fast_encode.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: the tiny model's tokenizer called the ways
the server and library users call it. Prints one JSON line."""

import json
import sys

from transformers import AutoTokenizer
from transformers._pb.runtime import split_encode

from patchbay.measure import prompt_texts

split_encode.PIECES = 8  # 0420: as many pieces as a 16-core host cuts, whatever this machine has
engaged = []
real_split = split_encode.encode


def counted_split(*args):
    found = real_split(*args)
    engaged.append(found is not None and len(args[1][0]))
    return found


split_encode.encode = counted_split

tok = AutoTokenizer.from_pretrained(sys.argv[1])
texts = ["", "def fibonacci(n):\n    return n", "  leading spaces\n\n\ttabs and ünïcödé ✓ 😀",
         prompt_texts.EDIT_TARGET[:900], prompt_texts.LONG_ARTICLE[:1200]]
long_text = (prompt_texts.EDIT_TARGET + prompt_texts.LONG_ARTICLE) * 3
messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": long_text}]

calls = {
    "single": [tok(t)["input_ids"] for t in texts],
    "no_specials": [tok(t, add_special_tokens=False)["input_ids"] for t in texts],
    "batch": dict(tok(texts, padding=True)),
    "pairs": dict(tok(texts[1:3], texts[3:5], return_token_type_ids=True, return_special_tokens_mask=True)),
    "truncated": dict(tok(texts, truncation=True, max_length=7, return_length=True)),
    "chat": tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"],
    "split_words": tok(["def", " f", "(x):"], is_split_into_words=True)["input_ids"],
    "long": tok(long_text)["input_ids"],
    "long_no_specials": tok(long_text, add_special_tokens=False)["input_ids"],
    "long_masks": dict(tok(long_text, return_special_tokens_mask=True, return_token_type_ids=True)),
}
offsets = tok(texts[2], return_offsets_mapping=True)
encoded = tok(texts[1])
try:
    mapped = encoded.char_to_token(4)
except ValueError as e:
    mapped = f"error: {e}"
print(json.dumps({"calls": calls, "offsets": offsets["offset_mapping"], "offsets_have_encodings": offsets.encodings is not None,
                  "plain_has_encodings": encoded.encodings is not None, "char_to_token": mapped,
                  "chat_tokens": len(calls["chat"]), "split_texts": [n for n in engaged if n]}))
