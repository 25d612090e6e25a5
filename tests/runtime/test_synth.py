"""Synthetic checkpoints: tokenizer, chat template, tiny checkpoint files, air12 shapes."""

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from patchbay.runtime import synth


@pytest.fixture(scope="module")
def tok():
    return synth.build_tokenizer()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return synth.write_tiny(tmp_path_factory.mktemp("tiny") / "ckpt", seed=0)


def render(tok, messages, **kwargs):
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


def test_tokenizer_round_trips_text(tok):
    text = "def f(x):\n    return {'k': x}  # café, 日本語, emoji 🙂\n\ttabs  and  spaces"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode())  # BPE merged something: it is not a byte tokenizer


def test_special_tokens_are_single_ids(tok):
    ids = [tok(t)["input_ids"] for t in synth.SPECIAL_TOKENS]
    assert all(len(i) == 1 for i in ids), dict(zip(synth.SPECIAL_TOKENS, ids))
    assert len({i[0] for i in ids}) == len(synth.SPECIAL_TOKENS)
    assert tok.eos_token == tok.pad_token == "<|endoftext|>"
    # Embedded in text they still come out whole, and decode back.
    ids = tok("a<|user|>b<tool_call>c")["input_ids"]
    assert tok.convert_tokens_to_ids("<|user|>") in ids and tok.decode(ids) == "a<|user|>b<tool_call>c"


def test_template_user_turn(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    out = render(tok, messages, add_generation_prompt=True)
    assert out == "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>"
    assert render(tok, messages[1:]) == "[gMASK]<sop><|user|>\nHi"


def test_template_tool_call_history(tok):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Use the tool.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2, "hourly": False}},
                }
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "sunny"},
        {"role": "assistant", "content": "21 and sunny."},
    ]
    out = render(tok, messages, tools=tools)
    tools_block, turns = out.split("<|user|>", 1)
    assert tools_block.startswith("[gMASK]<sop><|system|>\n")
    assert json.dumps(tools[0]) in tools_block and "<arg_key>" in tools_block
    assert turns == (
        "\nParis?<|assistant|>\n<think>Use the tool.</think>\nChecking.\n"
        "<tool_call>weather\n"
        "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
        "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
        "<arg_key>hourly</arg_key>\n<arg_value>false</arg_value>\n"
        "</tool_call>"
        '<|observation|>\n<tool_response>{"temp": 21}</tool_response>\n<tool_response>sunny</tool_response>'
        "<|assistant|>\n<think></think>\n21 and sunny."
    )


def test_template_keeps_past_thinking_only_when_asked(tok):
    turn = {"role": "assistant", "content": "A.", "reasoning_content": "think A"}
    messages = [{"role": "user", "content": "Q1"}, turn, {"role": "user", "content": "Q2"}]
    # GLM's interleaved thinking: reasoning before the last user turn is dropped ...
    assert "think A" not in render(tok, messages)
    assert render(tok, messages).count("<think></think>") == 1
    # ... unless clear_thinking is false, which keeps every turn's (prefix-stable prompts).
    kept = render(tok, messages, clear_thinking=False)
    assert "<|assistant|>\n<think>think A</think>\nA.<|user|>" in kept
    assert kept.startswith(render(tok, messages[:2], clear_thinking=False))


def test_template_enable_thinking(tok):
    messages = [{"role": "user", "content": "Hi"}]
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=False).endswith(
        "<|user|>\nHi<|assistant|>\n<think></think>"
    )
    assert render(tok, messages, add_generation_prompt=True, enable_thinking=True).endswith("<|assistant|>")
    assert render(tok, messages, add_generation_prompt=True).endswith("<|assistant|>")


def test_template_content_none(tok):
    messages = [
        {"role": "user", "content": None},
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "now", "arguments": {}}}]},
    ]
    out = render(tok, messages)
    assert "None" not in out
    assert out == "[gMASK]<sop><|user|>\n<|assistant|>\n<think></think>\n<tool_call>now\n</tool_call>"


def test_write_tiny_is_deterministic(tiny, tmp_path):
    again = synth.write_tiny(tmp_path / "again", seed=0)
    other = synth.write_tiny(tmp_path / "other", seed=1)
    names = sorted(p.name for p in tiny.iterdir())
    assert names == sorted(p.name for p in again.iterdir())
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "chat_template.jinja", synth.MARKER} <= set(names)  # fmt: skip
    for name in names:
        assert (tiny / name).read_bytes() == (again / name).read_bytes(), name
    assert (tiny / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    marker = json.loads((other / synth.MARKER).read_text())
    assert marker["model"] == "synthetic:tiny" and marker["seed"] == 1 and len(marker["corpus_sha256"]) == 64
    assert marker["params"] > 0


def test_write_tiny_is_idempotent(tiny):
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert synth.write_tiny(tiny, seed=0) == tiny
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before


def test_write_tiny_refuses_foreign_dir(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        synth.write_tiny(tmp_path, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_tiny_at_a_long_context_has_the_same_weights_and_takes_long_prompts(tiny, tmp_path, caplog):
    long = synth.write_tiny(tmp_path / "long", seed=0, context=65536)
    assert (long / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    for path, context in ((tiny, synth.TINY_CONTEXT), (long, 65536)):
        assert json.loads((path / "config.json").read_text())["max_position_embeddings"] == context
        assert json.loads((path / synth.MARKER).read_text())["context"] == context
    text = "def f(x):\n    return x + 1\n" * 4000  # about 40K tokens
    caplog.clear()
    ids = AutoTokenizer.from_pretrained(long)(text)["input_ids"]
    assert 30000 < len(ids) < 65536 and "longer than the specified maximum" not in caplog.text
    AutoTokenizer.from_pretrained(tiny)(text)  # the small context's tokenizer does warn: the check can fail
    assert "longer than the specified maximum" in caplog.text
    # Another context rewrites the checkpoint (the marker keys it).
    assert synth.write_tiny(long, seed=0, context=1024) == long
    assert json.loads((long / "config.json").read_text())["max_position_embeddings"] == 1024


def test_tiny_loads_and_generates(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    assert model.config.model_type == "glm4_moe" and model.dtype == torch.float32
    assert model.generation_config.do_sample is False
    assert model.generation_config.eos_token_id == synth.stop_ids(tok)
    replies = []
    for question in ("What is the capital of France?", "Write a haiku about the sea."):
        messages = [{"role": "user", "content": question}]
        inputs = tok.apply_chat_template(
            messages, add_generation_prompt=True, return_dict=True, return_tensors="pt"
        )
        out = model.generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        reply = out[0, inputs["input_ids"].shape[1] :].tolist()
        assert len(reply) == 8 and len(set(reply)) > 1  # not one token repeated
        replies.append(reply)
    assert replies[0] != replies[1]


def test_air12_has_27_24b_params():
    config = synth.air12_config()
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        4096, 96, 8, 128,
    )  # fmt: skip
    assert round(synth.count_params(config) / 1e9, 2) == 27.24


def test_air24_doubles_the_layers_and_needs_two_h200s():
    config = synth.air24_config()
    assert config.num_hidden_layers == 24 and config.first_k_dense_replace == 1
    params = synth.count_params(config)
    assert round(params / 1e9, 2) == 55.34
    assert params * 2 > 139e9 * 0.75  # 111 GB of bf16 weights: with a KV pool and graphs, not one H200


def test_write_air_saves_exactly_the_built_model_with_its_tokenizer(tmp_path):
    """air checkpoints for servers that load by path (tensor parallelism): the saved weights are
    the in-memory build's for the seed; shapes cut down here so it runs on a CPU."""
    from transformers import AutoTokenizer, Glm4MoeConfig, Glm4MoeForCausalLM

    small = synth.air12_config().to_dict()
    small.update(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, n_routed_experts=8, num_experts_per_tok=2, num_hidden_layers=2)
    config = Glm4MoeConfig(**small)
    out = synth.write_air(tmp_path / "air", "air-test", seed=3, device="cpu", config=config)
    marker = json.loads((out / synth.MARKER).read_text())
    assert marker["model"] == "synthetic:air-test" and marker["seed"] == 3
    loaded = Glm4MoeForCausalLM.from_pretrained(out, dtype=torch.bfloat16).eval()
    built = synth.build_air12("cpu", seed=3, config=config)
    saved, fresh = loaded.state_dict(), built.state_dict()
    assert saved.keys() == fresh.keys()
    assert all(torch.equal(saved[k], fresh[k]) for k in fresh)
    assert marker["params"] == sum(p.numel() for p in built.parameters())
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == config.vocab_size and tok.chat_template == synth.CHAT_TEMPLATE
    assert loaded.generation_config.do_sample is False

    stamp = (out / synth.MARKER).stat().st_mtime_ns
    assert synth.write_air(out, "air-test", seed=3, device="cpu", config=config) == out  # kept as is
    assert (out / synth.MARKER).stat().st_mtime_ns == stamp
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a patchbay synthetic checkpoint"):
        synth.write_air(foreign, "air-test", device="cpu", config=config)
    assert (foreign / "notes.txt").read_text() == "keep me"
