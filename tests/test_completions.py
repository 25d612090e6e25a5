"""0620 PB_COMPLETIONS: the legacy completions API through the real openai client, /version,
/detokenize and a non-streamed /v1/responses, against live servers with the knob on
(`server_on`, the embedded default) and off (`server_off`, upstream's behaviour)."""

import json
import threading

import httpx
import openai
import pytest

pytestmark = pytest.mark.engine

PROMPT = "def main():"


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def complete(server, **kwargs):
    return client(server).completions.create(model=server.model, **{"prompt": PROMPT, "max_tokens": 8, **kwargs})


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, timeout=120)


def test_temperature_zero_is_upstreams_greedy_reply(server_on, server_off):
    upstream = post(server_off, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8}).json()
    reply = complete(server_on, temperature=0)
    assert reply.choices[0].text == upstream["choices"][0]["text"]
    assert reply.usage.completion_tokens == upstream["usage"]["completion_tokens"] == 8
    assert reply.choices[0].finish_reason == "length"
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")


def test_a_seeded_reply_is_the_same_alone_and_batched(server_on):
    settings = {"temperature": 1.0, "top_p": 0.9, "seed": 1234, "max_tokens": 12}
    alone = complete(server_on, **settings)
    assert alone.choices[0].text != complete(server_on, temperature=0, max_tokens=12).choices[0].text
    results = {}

    def send(name, **kwargs):
        results[name] = complete(server_on, **kwargs)

    threads = [threading.Thread(target=send, args=("seeded",), kwargs=settings)]
    threads += [threading.Thread(target=send, args=(f"other{i}",),
                                 kwargs={"prompt": f"import os{i}", "temperature": 0.8, "max_tokens": 12})
                for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["seeded"].choices[0].text == alone.choices[0].text
    assert results["seeded"].model_extra["pb_fingerprint"] == alone.model_extra["pb_fingerprint"]
    other_seed = complete(server_on, **{**settings, "seed": 99})
    assert other_seed.choices[0].text != alone.choices[0].text


def test_n_gives_distinct_reproducible_choices(server_on):
    reply = complete(server_on, n=3, temperature=1.0, seed=7)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    texts = [c.text for c in reply.choices]
    assert len(set(texts)) == 3
    assert [c.text for c in complete(server_on, n=3, temperature=1.0, seed=7).choices] == texts
    # Choice 0 uses the seed itself: the same as n=1 with that seed.
    assert complete(server_on, temperature=1.0, seed=7).choices[0].text == texts[0]
    assert reply.usage.completion_tokens == 3 * 8
    greedy = complete(server_on, n=2, best_of=2, temperature=0)
    assert greedy.choices[0].text == greedy.choices[1].text  # best_of equal to n is accepted


def test_stop_ends_the_text_before_the_stop_string(server_on):
    whole = complete(server_on, temperature=0, max_tokens=16).choices[0].text
    at = next(i for i in range(3, len(whole) - 1) if whole[i:i + 2].isalnum() and whole[i:i + 2].isascii())
    stop = whole[at:at + 2]
    reply = complete(server_on, temperature=0, max_tokens=16, stop=[stop, "never-seen-xyz"])
    assert reply.choices[0].text == whole[:whole.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 16
    streamed = "".join(c.choices[0].text for c in complete(server_on, temperature=0, max_tokens=16, stop=stop,
                                                            stream=True) if c.choices)
    assert streamed == reply.choices[0].text
    kept = complete(server_on, temperature=0, max_tokens=16, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == whole[:whole.find(stop) + len(stop)]  # vLLM's field, as chat honours it


def test_logprobs_have_the_legacy_shape(server_on):
    reply = complete(server_on, temperature=0, logprobs=3, max_tokens=6)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    text = reply.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[0] == 0 and all(0 <= o <= len(text) for o in lp.text_offset)
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert chosen <= 0 and 1 <= len(top) <= 4 and top[token] == chosen
        assert max(top.values()) == chosen  # greedy: the chosen token is the most likely
    assert complete(server_on, temperature=0, max_tokens=6).choices[0].logprobs is None


def test_logit_bias_and_penalties_reach_the_sampler(server_on):
    tid = post(server_on, "/tokenize", {"prompt": " hello", "add_special_tokens": False}).json()["tokens"][0]
    reply = complete(server_on, temperature=0, max_tokens=4, logit_bias={str(tid): 100}, logprobs=0)
    assert reply.choices[0].logprobs.tokens == [post(server_on, "/detokenize", {"tokens": [tid]}).json()["prompt"]] * 4
    # A second favoured token behind it: the frequency penalty (2 a repeat) hands over to it.
    other = post(server_on, "/tokenize", {"prompt": " world", "add_special_tokens": False}).json()["tokens"][0]
    both = {str(tid): 100, str(other): 97}
    plain = complete(server_on, temperature=0, max_tokens=4, logit_bias=both).choices[0].text
    penalized = complete(server_on, temperature=0, max_tokens=4, logit_bias=both, frequency_penalty=2).choices[0].text
    assert plain != penalized


def test_echo_puts_the_prompt_first(server_on):
    plain = complete(server_on, temperature=0).choices[0].text
    assert complete(server_on, temperature=0, echo=True).choices[0].text == PROMPT + plain
    chunks = list(complete(server_on, temperature=0, echo=True, stream=True))
    assert chunks[0].choices[0].text == PROMPT
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT + plain


def test_an_echoed_line_separator_does_not_cut_the_stream(server_on):
    """U+2028, U+2029 and U+0085 echoed from the prompt: httpx's iter_lines splits where
    str.splitlines does, and still every data line is whole JSON holding the prompt."""
    prompt = "a\u2028b\u2029c\x85d"
    with httpx.stream("POST", f"{server_on.url}/v1/completions", timeout=120,
                      json={"model": server_on.model, "prompt": prompt, "max_tokens": 2, "echo": True,
                            "temperature": 0, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    chunks = [json.loads(line[len("data: "):]) for line in lines]  # a cut line would not parse
    assert chunks[0]["choices"][0]["text"] == prompt


def test_a_list_of_prompts_and_token_id_prompts(server_on):
    prompts = [PROMPT, "import os", "class A:"]
    alone = [complete(server_on, prompt=p, temperature=0).choices[0].text for p in prompts]
    reply = complete(server_on, prompt=prompts, temperature=0, n=2)
    assert [c.index for c in reply.choices] == list(range(6))
    assert [c.text for c in reply.choices] == [t for t in alone for _ in range(2)]  # greedy: both alike
    ids = [post(server_on, "/tokenize", {"prompt": p}).json()["tokens"] for p in prompts[:2]]
    by_ids = complete(server_on, prompt=ids, temperature=0)
    assert [c.text for c in by_ids.choices] == alone[:2]
    assert by_ids.usage.prompt_tokens == len(ids[0]) + len(ids[1])
    assert complete(server_on, prompt=ids[1], temperature=0).choices[0].text == alone[1]


def test_streams_carry_usage_only_when_asked(server_on):
    plain = list(complete(server_on, temperature=0, n=2, stream=True))
    assert all(len(c.choices) == 1 and c.object == "text_completion" for c in plain)
    assert all(c.usage is None for c in plain)
    assert sorted(c.choices[0].index for c in plain if c.choices[0].finish_reason) == [0, 1]
    with_usage = list(complete(server_on, temperature=0, n=2, stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens == 16
    assert all(c.usage is None for c in with_usage[:-1])
    for i in (0, 1):
        assert "".join(c.choices[0].text for c in with_usage if c.choices and c.choices[0].index == i) == \
            complete(server_on, temperature=0).choices[0].text
    with httpx.stream("POST", f"{server_on.url}/v1/completions", timeout=120,
                      json={"model": server_on.model, "prompt": PROMPT, "max_tokens": 3, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and "pb_fingerprint" in json.loads(lines[-2][6:])


def test_version_names_the_engine_and_the_build(server_on):
    r = httpx.get(f"{server_on.url}/version", timeout=30)
    assert r.status_code == 200
    assert r.json()["version"].startswith("5.23.0")
    assert r.json()["build"] == r.headers["x-pb-build"] and r.json()["build"].startswith("pb-")


def test_detokenize_undoes_tokenize(server_on):
    text = "def add(a, b):\n    return a + b\n"
    ids = post(server_on, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
    assert post(server_on, "/detokenize", {"tokens": ids}).json() == {"prompt": text}
    assert post(server_on, "/detokenize", {"tokens": []}).json() == {"prompt": ""}
    for bad in ([10**9], [-1], ["a"], "abc"):
        r = post(server_on, "/detokenize", {"tokens": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", (bad, r.text)


def test_responses_without_stream_answer_json(server_on):
    r = post(server_on, "/v1/responses", {"input": "hello", "max_output_tokens": 4})
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["object"] == "response" and r.json()["status"] == "completed"
    assert r.json()["output"][0]["content"][0]["text"]
    reply = client(server_on).responses.create(model=server_on.model, input="hello", max_output_tokens=4)
    assert reply.output_text == r.json()["output"][0]["content"][0]["text"]
    with httpx.stream("POST", f"{server_on.url}/v1/responses", timeout=120,
                      json={"model": server_on.model, "input": "hello", "max_output_tokens": 4, "stream": True}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")


@pytest.mark.parametrize("fields,param", [
    ({"best_of": 3}, "best_of"),
    ({"echo": True, "logprobs": 1}, "echo"),
    ({"logprobs": 9}, "logprobs"),
    ({"n": 0}, "n"),
    ({"prompt": ["a"] * 20, "n": 10}, "n"),
    ({"temperature": 5}, "temperature"),
    ({"stop": ""}, "stop"),
    ({"prompt": [[]]}, "prompt"),
    ({"prompt": [[1, 2], "a"]}, "prompt"),
    ({"prompt": [[10**9]]}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
])
def test_bad_values_are_400s_naming_the_field(server_on, fields, param):
    r = post(server_on, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.text  # a nested field: its path


def test_without_the_knob_upstream_answers_as_before(server_off):
    # Upstream ignores n and sampling and has no /version or /detokenize.
    r = post(server_off, "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "n": 3})
    assert r.status_code == 200 and len(r.json()["choices"]) == 1
    assert httpx.get(f"{server_off.url}/version", timeout=30).status_code == 404
    assert post(server_off, "/detokenize", {"tokens": [1, 2]}).status_code == 404
    assert post(server_off, "/v1/completions", {"prompt": [PROMPT, PROMPT]}).status_code >= 400
    # Its /v1/responses streams when `stream` is absent.
    with httpx.stream("POST", f"{server_off.url}/v1/responses", timeout=120,
                      json={"model": server_off.model, "input": "hello", "max_output_tokens": 4}) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
