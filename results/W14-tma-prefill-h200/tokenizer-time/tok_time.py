"""An 8K-token prompt's text through the synthetic tokenizer on this host: one call (0360's
encode_batch_fast) against 0420's pieces, best of 20 each. Prints one JSON line."""
import json, os, time
from patchbay import prompts, synth
from transformers._pb import split_encode
split_encode.knobs.get = lambda name: name == "PB_SPLIT_ENCODE"
tok = synth.padded_tokenizer(151552)
bt = tok.backend_tokenizer
p = prompts.select(["prefill"])[0]
text = tok.decode(tok(" ".join(m["content"] for m in p.messages()))["input_ids"][:8192])
ref = bt.encode_batch_fast([text], add_special_tokens=True)[0].ids
out = {"cpus": os.cpu_count(), "chars": len(text), "tokens": len(ref)}
def best(f):
    ts = []
    for _ in range(20):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return round(min(ts) * 1000, 2), round(sorted(ts)[10] * 1000, 2)
out["one_call_ms_best_median"] = best(lambda: bt.encode_batch_fast([text], add_special_tokens=True))
out["with_offsets_ms_best_median"] = best(lambda: bt.encode_batch([text], add_special_tokens=True))
for n in (2, 4, 8):
    split_encode.PIECES = n
    got = split_encode.encode(bt, [text], True, False)
    out[f"pieces_{n}"] = {"cuts": len(split_encode.cuts(text, min(n, len(text) // split_encode.PIECE_CHARS))),
                          "same_ids": got is not None and got[0].ids == ref,
                          "ms_best_median": best(lambda: split_encode.encode(bt, [text], True, False))}
print(json.dumps(out))
