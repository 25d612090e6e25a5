"""PB_COMPLETIONS: the legacy /v1/completions API whole, /detokenize, /version, and a
/v1/responses request without `stream` answered as one JSON object.

Under continuous batching a completions request takes this module's reply path instead of
upstream's (which honours none of the sampling fields and one string prompt only). Every
prompt (a string, a list of them, a list of token ids or a list of such lists) gives `n`
choices, each its own generation with its own sampling spec (runtime/sampler.py): choice
`prompt_index * n + j`. Text is raw: no chat template, no tool parsing, special tokens
skipped as upstream does. With a seed, choice j of every prompt uses a seed derived from it
(j = 0 the seed itself), so choices differ and each is reproducible.
"""

import asyncio
import hashlib
import json
import time
import types
import uuid

from .. import knobs
from . import chat, context, errors, fingerprint, limits, reply, shapes, sse, tokenize, vllm_fields
from . import stops as stops_
from .choices import seed_for
from ..runtime import batched_sampler, sampler
from ..runtime.let_go import let_go

MAX_CHOICES = 128  # prompts x n in one request
TAKEN = ("n", "best_of", "echo", "logprobs", "stream_options", "presence_penalty", "user")
PROMPT_FORMS = "a string, a list of strings, a list of token ids or a list of lists of token ids"


def on() -> bool:
    return bool(knobs.get("PB_COMPLETIONS"))


def responses_streams(body: dict):
    """/v1/responses: whether to answer with a stream. Upstream streams unless the client sends
    `stream: false`; OpenAI (and this knob) only when it sends `stream: true`."""
    if on():
        return bool(body.get("stream"))
    return body.get("stream", True)


def _bad(message: str, param: str, code: str = "invalid_value") -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code=code, param=param)


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


def prompts_of(prompt) -> list:
    """The request's prompts, each a string or a list of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(_is_id(t) for t in prompt):
            return [prompt]
        if all(isinstance(p, list) and p and all(_is_id(t) for t in p) for p in prompt):
            return list(prompt)
    raise _bad(f"prompt must be {PROMPT_FORMS} (non-negative integers, none of the lists empty)", "prompt",
               "invalid_prompt")


def _checked(taken: dict, n_prompts: int) -> dict:
    n = taken.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise _bad(f"n={n!r} is not valid (allowed: an integer from 1 to {MAX_CHOICES})", "n")
    if n * n_prompts > MAX_CHOICES:
        raise _bad(f"{n_prompts} prompts x n={n} is {n * n_prompts} choices (allowed: at most {MAX_CHOICES})", "n")
    if taken.get("best_of") not in (None, n) or isinstance(taken.get("best_of"), bool):
        raise _bad(f"best_of={taken['best_of']!r} is not supported (allowed: absent, or equal to n={n})",
                   "best_of", "unsupported_value")
    echo = taken.get("echo", False)
    if echo is not None and not isinstance(echo, bool):
        raise _bad(f"echo={echo!r} is not valid (allowed: true, false)", "echo")
    logprobs = taken.get("logprobs")
    if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int) or not 0 <= logprobs <= 5):
        raise _bad(f"logprobs={logprobs!r} is not valid (allowed: an integer from 0 to 5)", "logprobs")
    if echo and logprobs is not None:
        raise _bad("echo with logprobs is not supported: the prompt's own log-probabilities are not computed "
                   "(send one of the two)", "echo", "unsupported_combination")
    options = taken.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    if options is not None and (not isinstance(options, dict) or
                                not isinstance(options.get("include_usage", False), bool)):
        raise _bad("stream_options must be an object such as {\"include_usage\": true}", "stream_options")
    return {"n": n, "echo": bool(echo), "logprobs": logprobs, "include_usage": include_usage,
            "presence_penalty": taken.get("presence_penalty")}


def completion_id(request_id: str) -> str:
    try:
        return f"cmpl-{uuid.UUID(request_id).hex}"
    except ValueError:
        return f"cmpl-{hashlib.sha256(request_id.encode()).hexdigest()[:32]}"


class Choice:
    """One generation of one prompt, as text: stop strings cut it, logprobs follow it."""

    def __init__(self, index: int, request_id: str, tokenizer, prompt_len: int, head: str, max_new_tokens,
                 spec, stops, eos, top: int | None):
        from tokenizers.decoders import DecodeStream

        self.index, self.request_id, self.tokenizer = index, request_id, tokenizer
        self.rust = tokenizer._tokenizer
        self.decoder = DecodeStream([], skip_special_tokens=True)
        self.prompt_len, self.head, self.max_new_tokens = prompt_len, head, max_new_tokens
        self.spec, self.stops, self.top = spec, tuple(stops), top
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        self.cutter = stops_.StopCutter(self.stops, bool(vllm_fields.get("include_stop_str_in_output")))
        self.tokens: list[int] = []
        self.text = ""  # generated text released so far
        self.entries: list[tuple[int, int]] = []  # (token index, offset in the generated text)
        self.sent = 0  # entries already given out (streaming)
        self.finished = False
        self.error: str | None = None

    def take(self, output) -> str:
        """New tokens of a GenerationOutput -> the text they release."""
        released = ""
        for token in output.generated_tokens[len(self.tokens):]:
            if self.stopped:
                break
            self.tokens.append(int(token))
            if int(token) in self.eos:
                continue
            self.entries.append((len(self.tokens) - 1, len(self.text) + len(self.cutter.held)))
            ready = self.cutter.feed(self.decoder.step(self.rust, int(token)) or "")
            self.text += ready
            released += ready
        if output.error is not None:
            self.error = str(output.error)
        if (output.is_finished() or self.stopped) and not self.finished:
            self.finished = True
            rest = self.cutter.flush()
            self.text += rest
            released += rest
        return released

    @property
    def stopped(self) -> bool:
        """A stop string ended the text."""
        return self.cutter.stopped

    def finish_reason(self) -> str:
        truncated = self.max_new_tokens is not None and len(self.tokens) >= self.max_new_tokens
        return "length" if truncated and not self.stopped else "stop"

    def logprobs(self, final: bool = False) -> dict | None:
        """The legacy `logprobs` object of the entries not given out yet whose text is released."""
        if self.top is None:
            return None
        end = len(self.entries)
        if not final or self.stopped:
            end = sum(1 for _, offset in self.entries if offset < len(self.text))
        entries, self.sent = self.entries[self.sent:end], max(self.sent, end)
        spec, out = self.spec, {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if entries:
            batched_sampler.settle(spec, entries[-1][0] + 1)
        for i, offset in entries:
            token = self.tokens[i]
            chosen = spec.chosen_logprobs[i] if spec is not None and i < len(spec.chosen_logprobs) else None
            top = {}  # two ids may decode alike (a lone byte): the likelier one is kept
            for t, lp in (spec.top[i] if spec is not None and i < len(spec.top) else []):
                top.setdefault(self._text(t), lp)
            if chosen is not None:
                top.setdefault(self._text(token), chosen)  # the sampled token is always listed
            out["tokens"].append(self._text(token))
            out["token_logprobs"].append(chosen)
            out["top_logprobs"].append(top)
            out["text_offset"].append(len(self.head) + offset)
        return out

    def _text(self, token: int) -> str:
        return reply.token_text(self.tokenizer, token)[0]


async def handle(handler, body: dict, request_id: str):
    """The hook: answer the request on this path, or None for upstream's."""
    if not on():
        return None
    knobs.take_request_overrides(body)
    model_id, model, processor = handler._resolve_model(body)
    modality = handler.model_manager.get_model_modality(model, processor=processor)
    if not handler.generation_state.use_continuous_batching(model, modality):
        return None
    taken = {key: body.pop(key) for key in TAKEN if key in body}
    handler._validate_request(body)
    prompts = prompts_of(body.get("prompt", ""))  # upstream's default: an empty prompt (0500 refuses it)
    opts = _checked(taken, len(prompts))
    stops = () if body.get("stop") is None else chat.parse_stop(body["stop"])
    tokenizer = getattr(processor, "tokenizer", processor)
    # The batch's own settings come from the model's defaults and the plain fields; each choice's
    # spec carries the penalties, stop strings and seed (upstream would reseed torch's global one).
    plain = {k: v for k, v in body.items() if k not in ("stop", "frequency_penalty", "seed")}
    gen_config = handler._build_generation_config(plain, model.generation_config, use_cb=True)
    gen_manager = handler.generation_state.get_manager(model_id, use_cb=True)
    runs = []
    for p in prompts:
        if isinstance(p, str):
            ids, head = list((await limits.prepare(tokenizer, p, return_tensors=None))["input_ids"]), p
        else:
            ids, head = list(tokenize.token_inputs(p, model, True)["input_ids"]), tokenizer.decode(p)
        limit = types.SimpleNamespace(max_new_tokens=gen_config.max_new_tokens)  # each prompt's own room
        context.enforce(model, ids, limit, "prompt")  # a prompt over the context: context_length_exceeded
        shapes.check_room(body, len(ids), context.max_model_len(model.config))  # 0610: a 400, not a clamp
        errors.check_inputs(model, {"input_ids": ids}, limit)  # 0500 refuses an empty prompt
        runs.append((ids, head, limit.max_new_tokens))
    gen_manager.init_cb(model, gen_config)
    gen_manager._check_alive(request_id)
    cb = gen_manager._cb
    taken_spec = {"presence_penalty": opts["presence_penalty"], "logprobs": opts["logprobs"] is not None,
                  "top_logprobs": opts["logprobs"] or 0}
    choices = []
    for p, (ids, head, max_new) in enumerate(runs):
        for j in range(opts["n"]):
            index = p * opts["n"] + j
            spec = chat.build_spec(body, taken_spec, gen_config, tokenizer)
            if spec.seed is not None:
                spec.seed = seed_for(spec.seed, j)
            spec = chat.under_graphs(cb, spec)
            rid = request_id if index == 0 else f"{request_id}/{index}"
            choices.append((Choice(index, rid, tokenizer, len(ids), head if opts["echo"] else "", max_new, spec,
                                   stops, gen_config.eos_token_id, opts["logprobs"]), ids))
    return await _run(cb, body, request_id, model_id, choices, opts, gen_config)


async def _run(cb, body, request_id, model_id, choices, opts, gen_config):
    from fastapi.responses import JSONResponse, StreamingResponse

    queue: asyncio.Queue = asyncio.Queue()
    for choice, ids in choices:
        if choice.spec is not None:
            sampler.register(choice.request_id, choice.spec)
        cb.register_result_handler(choice.request_id, lambda out, c=choice: queue.put_nowait((c, out)))
        cb.add_request(ids, request_id=choice.request_id, streaming=True, max_new_tokens=choice.max_new_tokens,
                       eos_token_id=gen_config.eos_token_id)
    everyone = [c for c, _ in choices]
    created, cid = int(time.time()), completion_id(request_id)

    def done() -> None:
        for c in everyone:
            sampler.release(c.request_id)
            if c.stopped or not c.finished:
                let_go(cb, c.request_id)

    def usage() -> dict:
        prompt = sum(c.prompt_len for c in everyone if c.index % opts["n"] == 0)
        completion = sum(len(c.tokens) for c in everyone)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    all_tokens = lambda: [t for c in everyone for t in c.tokens]  # noqa: E731
    suffix = body.get("suffix") or ""

    if not body.get("stream"):
        try:
            while not all(c.finished for c in everyone):
                choice, output = await queue.get()
                choice.take(output)
            failed = [c.error for c in everyone if c.error is not None]
            if failed:
                raise RuntimeError(f"generation failed for {request_id}: {failed[0]}")
            result = {"id": cid, "object": "text_completion", "created": created, "model": model_id,
                      "choices": [{"index": c.index, "text": c.head + c.text + suffix,
                                   "logprobs": c.logprobs(final=True), "finish_reason": c.finish_reason()}
                                  for c in everyone],
                      "usage": usage()}
            if shapes.on():
                result["system_fingerprint"] = shapes.system_fingerprint()
        finally:
            done()
        return JSONResponse(fingerprint.stamp(result, all_tokens(), request_id))

    def chunk(choice, text, finish_reason=None, logprobs=None) -> str:
        part = {"index": choice.index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        return _sse({"id": cid, "object": "text_completion", "created": created, "model": model_id,
                     "choices": [part]})

    async def events():
        try:
            heads = [chunk(c, c.head) for c in everyone if c.head]
            if heads:
                yield "".join(heads)
            last = None
            while not all(c.finished for c in everyone):
                choice, output = await queue.get()
                text = choice.take(output)
                if choice.error is not None:
                    yield sse.error_event(choice.error)
                    return
                parts = []
                logprobs = choice.logprobs(final=choice.finished)
                if text or (logprobs and logprobs["tokens"]):
                    parts.append(chunk(choice, text, logprobs=logprobs))
                if choice.finished:
                    if suffix:
                        parts.append(chunk(choice, suffix))
                    last = chunk(choice, "", choice.finish_reason())
                    if not all(c.finished for c in everyone):
                        parts.append(last)
                if parts:
                    yield "".join(parts)
            if opts["include_usage"]:
                yield last
                last = _sse({"id": cid, "object": "text_completion", "created": created, "model": model_id,
                             "choices": [], "usage": usage()})
            yield fingerprint.stamp_sse(last, _Ids(all_tokens()), request_id)
        finally:
            done()

    return StreamingResponse(sse.finish(events()), media_type="text/event-stream")


def _sse(obj: dict) -> str:
    return f"data: {reply.dumps(obj)}\n\n"


class _Ids:
    """What fingerprint.stamp_sse reads from a streamer: the generated ids."""

    def __init__(self, ids):
        self._pb_ids = ids


def install(app, chat_handler) -> None:
    """GET /version and POST /detokenize."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    @app.get("/version")
    async def version():
        import transformers

        return JSONResponse({"version": transformers.__version__,
                             "build": knobs.build_id()})

    @app.post("/detokenize")
    async def detokenize(request: Request, body: dict):
        knobs.take_request_overrides(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(_is_id(t) for t in ids):
            raise _bad("tokens must be a list of token ids (non-negative integers)", "tokens", "invalid_tokens")
        _, _, processor = chat_handler._resolve_model(body)
        tokenizer = getattr(processor, "tokenizer", processor)
        vocab = len(tokenizer)
        if ids and max(ids) >= vocab:
            raise _bad(f"token id {max(ids)} is outside the vocabulary (0 to {vocab - 1})", "tokens",
                       "invalid_tokens")
        return JSONResponse({"prompt": tokenizer.decode(ids)})
