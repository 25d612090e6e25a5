"""patchbay's reply path for /v1/chat/completions under continuous batching.

Upstream builds the prompt and the generation config; from there this module submits the
request to the continuous-batching manager and answers in the OpenAI shape, streamed or not;
each choice's tokens are decoded and parsed as they come by a `reply.Reply`. It is entered only when one of its knobs is on for the request
(see `engaged`); otherwise upstream answers, unchanged.
"""

import contextvars
import time

from . import (choices, errors, fingerprint, forced, glm_parser, grammar, limits, messages, reply_process,
               shapes, sse, stream_interval, thinking, vllm_fields)
from ..runtime import graphs, sampler
from .context import max_model_len
from .reply import PROMPT_TAIL, Reply, dumps as _dumps, parses
from .. import knobs


def samples() -> bool:
    return bool(knobs.get("PB_REQUEST_SAMPLING"))


def engaged(model, use_cb: bool) -> bool:
    """Whether this request takes patchbay's reply path (continuous batching only)."""
    return use_cb and (parses(model) or samples() or forced.on() or grammar.on() or grammar.tools_on()
                       or thinking.on())


# Fields of the request that upstream's validation must not see (or would only warn about).
_fields: contextvars.ContextVar = contextvars.ContextVar("pb_chat_fields", default=None)
SAMPLING_FIELDS = ("top_k", "min_p", "presence_penalty", "logprobs", "top_logprobs", "n")
# Accepted by the OpenAI schema, but nothing here can honour them: refused by name.
UNSUPPORTED_FIELDS = ("audio", "function_call", "functions", "modalities", "prediction", "web_search_options")


def _bad(message: str, param: str, code: str = "invalid_request") -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code=code, param=param)


def take_fields(body: dict) -> None:
    """Before upstream validates the body: take the fields this module answers for."""
    taken = {}
    vllm_fields.map_legacy(body)
    if samples():
        unsupported = sorted(k for k in UNSUPPORTED_FIELDS if body.get(k) is not None)
        if unsupported:
            raise _bad(f"unsupported field(s): {', '.join(unsupported)}", unsupported[0], "unsupported_field")
        for key in SAMPLING_FIELDS:
            if key in body:
                taken[key] = body.pop(key)
        n = taken.get("n")
        if n not in (None, 1):
            if not vllm_fields.on():
                raise _bad(f"n={n!r} is not supported (allowed: 1)", "n", "unsupported_value")
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= vllm_fields.MAX_CHOICES:
                raise _bad(f"n={n!r} is not valid (allowed: an integer from 1 to {vllm_fields.MAX_CHOICES})", "n",
                           "invalid_value")
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise _bad(f"{key}={value!r} is not valid (allowed: an integer of at least 1)", key, "invalid_value")
    if forced.on() and "pb_forced" in body:
        taken["pb_forced"] = body.pop("pb_forced")
    if grammar.on():
        for key in grammar.FIELDS:
            if key in body:
                taken[key] = body.pop(key)
    if thinking.on():
        effort = messages.asked_effort() if messages.on() else body.pop("reasoning_effort", None)
        thinking.check_effort(effort)
        taken["reasoning_effort"] = effort
    _fields.set(taken)


def _number(value, name: str, low: float, high: float, integer: bool = False):
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        what = "an integer" if integer else "a number"
        raise _bad(f"{name}={value!r} is not valid (allowed: {what} from {low} to {high})", name, "invalid_value")
    return value


def spec_for(body: dict, gen_config, tokenizer) -> "sampler.Spec | None":
    """The request's own sampling settings (None when PB_REQUEST_SAMPLING is off)."""
    if not samples():
        return None
    return build_spec(body, _fields.get() or {}, gen_config, tokenizer)


def build_spec(body: dict, taken: dict, gen_config, tokenizer) -> "sampler.Spec":
    """A Spec from the body's sampling fields and those taken from it before validation."""
    spec = sampler.Spec()
    temperature = body.get("temperature")
    if temperature is not None:
        spec.temperature = float(_number(temperature, "temperature", 0, 2))
    if body.get("top_p") is not None:
        spec.top_p = float(_number(body["top_p"], "top_p", 0, 1))
    if taken.get("top_k") is not None:
        spec.top_k = _number(taken["top_k"], "top_k", 0, 1 << 20, integer=True)
    if taken.get("min_p") is not None:
        spec.min_p = float(_number(taken["min_p"], "min_p", 0, 1))
    asks_sampling = body.get("top_p") is not None or taken.get("top_k") or taken.get("min_p")
    if temperature is not None:
        spec.do_sample = spec.temperature > 0
    else:
        spec.do_sample = bool(asks_sampling or getattr(gen_config, "do_sample", False))
        spec.temperature = float(getattr(gen_config, "temperature", None) or 1.0)
    for name in ("presence_penalty", "frequency_penalty"):
        value = taken.get(name) if name in taken else body.get(name)
        if value is not None:
            setattr(spec, name, float(_number(value, name, -2, 2)))
    if body.get("logit_bias"):
        bias = body["logit_bias"]
        vocab = len(tokenizer)
        try:
            spec.logit_bias = {int(k): float(_number(v, "logit_bias", -100, 100)) for k, v in bias.items()}
        except (AttributeError, ValueError):
            raise _bad("logit_bias must map token ids to numbers from -100 to 100", "logit_bias") from None
        if any(not 0 <= k < vocab for k in spec.logit_bias):
            raise _bad(f"logit_bias has a token id outside the vocabulary (0 to {vocab - 1})", "logit_bias")
    if body.get("seed") is not None:
        spec.seed = _number(body["seed"], "seed", -(1 << 63), (1 << 63) - 1, integer=True) % (1 << 63)
    if taken.get("logprobs"):
        spec.logprobs = True
        if taken.get("top_logprobs") is not None:
            spec.top_logprobs = _number(taken["top_logprobs"], "top_logprobs", 0, 20, integer=True)
    elif taken.get("top_logprobs"):
        raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
    return spec


def stop_strings(body: dict) -> tuple:
    if not samples() or body.get("stop") is None:
        return ()
    return parse_stop(body["stop"])


def parse_stop(stop) -> tuple:
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not 1 <= len(stops) <= 4 or not all(isinstance(s, str) and s for s in stops):
        raise _bad("stop must be a non-empty string or a list of 1 to 4 of them", "stop")
    return tuple(stops)


class _Chunks:
    """One stream's `data:` events. The fields every chunk repeats (id, object, created, model,
    system_fingerprint) are serialized once; a chunk's own part is its choice and usage, and
    the logprobs come as the JSON text Reply.logprobs_json wrote. The bytes are those of
    json.dumps over the whole chunk (the keys in the same order)."""

    def __init__(self, request_id: str, model_id: str, created: int):
        head = {"id": shapes.reply_id(request_id), "object": "chat.completion.chunk", "created": created,
                "model": model_id, "system_fingerprint": shapes.system_fingerprint()}
        self.head = "data: " + _dumps(head)[:-1] + ',"choices":'

    def __call__(self, delta: dict | None, finish_reason=None, usage=None, logprobs: str | None = None,
                 index: int = 0) -> str:
        choices = "[]"
        if delta is not None or finish_reason is not None:
            choices = _dumps([{"index": index, "delta": delta or {}, "finish_reason": finish_reason}])
            if logprobs is not None:  # the choice's last key
                choices = f'{choices[:-2]},"logprobs":{{"content":{logprobs}}}}}]'
        usage = "" if usage is None else ',"usage":' + _dumps(usage)
        return f"{self.head}{choices}{usage}}}\n\n"


def _graphs_block(cb) -> bool:
    return any(cb.continuous_batching_config.cuda_graph_booleans) and not graphs.on()


def thinking_mask(constraint, tokenizer, model, input_ids, max_new_tokens, eos, cb):
    """0150: the request's mask with its thinking budget (the constraint itself when the reply
    does not think and writes no required calls, or when a plain reply's mask could not run
    under CUDA graphs)."""
    phase = grammar.start_phase(tokenizer, input_ids)
    ids = tokenizer.convert_tokens_to_ids
    stops = None
    if getattr(constraint, "calls_only", False):
        stops = list(eos if isinstance(eos, (list, tuple)) else [eos])
    if phase == "body" and stops is None:  # the prompt closed the thinking, or the template has none
        return constraint
    if constraint is None and _graphs_block(cb):
        return None
    if constraint is None or constraint.matcher is None:
        # No grammar (tool_choice none only forbids the call tokens): a constraint that follows
        # the phases from where the prompt left them.
        vocab, forbid = model.config.get_text_config().vocab_size, constraint.forbid if constraint else []

        def make():
            follower = grammar.Constraint(None, tokenizer, vocab, phase)
            follower.forbid = forbid
            return follower
    else:
        make = lambda: constraint
    budget = thinking.budget_for((_fields.get() or {}).get("reasoning_effort"), max_new_tokens)
    return thinking.Budget(make, ids(glm_parser.END_THINK), budget, max_new_tokens, stops)


def under_graphs(cb, spec):
    """The spec to register, given whether the server captures CUDA graphs (resolved when the
    manager was created: the batch processor may not exist yet)."""
    if spec is not None and any(cb.continuous_batching_config.cuda_graph_booleans) and not graphs.on():
        # A captured graph replays its sampling without Python: the hook cannot run. A plain
        # greedy request needs none (the batch's own settings apply); anything else is refused.
        if not spec.plain_greedy:
            raise _bad("per-request sampling, logprobs, forced replies and grammars are not available while "
                       "the server captures CUDA graphs (start it without them)", "temperature",
                       "unsupported_server_setting")
        return None
    return spec


async def respond(handler, body: dict, request_id: str, model_id: str, model, processor, inputs, gen_config,
                  gen_manager):
    """Submit the request and answer it; the hook returns what this returns."""
    from fastapi.responses import JSONResponse, StreamingResponse

    tokenizer = getattr(processor, "tokenizer", processor)
    input_ids = list(inputs["input_ids"])
    spec = spec_for(body, gen_config, tokenizer)
    if forced.on():
        reply_to_force, asked = forced.take(body, (_fields.get() or {}).get("pb_forced"))
        if reply_to_force is not None:
            spec = spec or sampler.Spec()
            spec.forced = forced.token_ids(reply_to_force, tokenizer)
            eos = gen_config.eos_token_id
            spec.forced_end = eos[0] if isinstance(eos, (list, tuple)) else eos
            spec.logprobs = spec.logprobs or asked
    # Grammar compiles are CPU work: off the event loop when PB_PREP_THREAD is on.
    taken = _fields.get() or {}
    constraint = await limits.prepare(grammar.constraint_for, body, taken, tokenizer, model, gen_config, input_ids,
                                      heavy=grammar.asks_constraint(body, taken))
    tool_constraint = await limits.prepare(grammar.tool_constraint, body, tokenizer, model, gen_config, input_ids,
                                           heavy=grammar.asks_tool_grammar(body))
    if constraint is not None and tool_constraint is not None:
        raise _bad("a structured-output constraint and an enforced tool_choice cannot be combined",
                   "tool_choice", "unsupported_combination")
    constraint = constraint or tool_constraint
    if constraint is not None:
        spec = spec or sampler.Spec()
        spec.mask = constraint
    eos = gen_config.eos_token_id
    if vllm_fields.on():
        eos = vllm_fields.eos_ids(eos)
        if vllm_fields.wants_spec():
            spec = spec or sampler.Spec()
            vllm_fields.apply(spec, input_ids, gen_config.eos_token_id)
    gen_manager._check_alive(request_id)
    errors.check_inputs(model, inputs, gen_config)
    shapes.check_room(body, len(input_ids), max_model_len(model.config))
    cb = gen_manager._cb
    if thinking.on():
        mask = thinking_mask(constraint, tokenizer, model, input_ids, gen_config.max_new_tokens,
                            gen_config.eos_token_id, cb)
        if mask is not None:
            spec = spec or sampler.Spec()
            spec.mask = mask
    spec = under_graphs(cb, spec)
    # A tool grammar's calls may carry its whitespace padding inside their values (not 0150's tight
    # grammar of tool_choice required or a named function; auto with strict tools keeps it).
    padded = (tool_constraint is not None and tool_constraint.matcher is not None
              and not getattr(tool_constraint, "calls_only", False))
    n = (_fields.get() or {}).get("n") or 1
    if n > 1 and (constraint is not None or (spec is not None and spec.forced is not None)):
        raise _bad("n > 1 cannot be combined with a grammar (response_format, guided fields, an enforced "
                   "tool_choice) or a forced reply (allowed: n=1 with those)", "n", "unsupported_combination")
    stops = stop_strings(body)
    created = int(time.time())
    where = shapes.usage_in_stream(body)
    offload = None
    if body.get("stream") and n == 1 and reply_process.on():  # 0720: the per-token work in a process of its own
        offload = await reply_process.open_stream(request_id, tokenizer, spec, reply_process.Opening(
            input_ids[-PROMPT_TAIL:], len(input_ids), body.get("tools"), parses(model), padded, stops, eos,
            gen_config.max_new_tokens, model_id, created, where))
    group = choices.Choices(
        gen_manager._cb, request_id, n, spec,
        lambda rid, s: Reply(rid, tokenizer, input_ids, body.get("tools"), model, gen_config.max_new_tokens,
                             spec=s, stops=stops, eos=eos, padded=padded),
        input_ids, gen_config.max_new_tokens, (eos or -1) if vllm_fields.on() else eos,
        handler=None if offload is None else offload.take)
    for s in group.specs[1:]:  # each choice thinks on its own budget
        if s is not None and isinstance(s.mask, thinking.Budget):
            s.mask = s.mask.fresh()

    if not body.get("stream"):
        try:
            while not group.finished:
                await group.next()
            if group.error() is not None:
                raise RuntimeError(f"generation failed for {request_id}: {group.error()}")
            answers = []
            for j, reply in enumerate(group.replies):
                choice = {"index": j, "message": reply.message(), "finish_reason": reply.finish_reason()}
                if reply.spec is not None and reply.spec.logprobs:
                    choice["logprobs"] = {"content": reply.logprobs}
                answers.append(choice)
            result = {"id": shapes.reply_id(request_id), "object": "chat.completion", "created": created,
                      "model": model_id, "choices": answers, "usage": group.usage()}
            if shapes.on():
                result["system_fingerprint"] = shapes.system_fingerprint()
        finally:
            group.done()
        return JSONResponse(fingerprint.stamp(result, group.tokens(), request_id))

    if offload is not None:
        events = offload.events(group, _Chunks(request_id, model_id, created), _Ids)
        return StreamingResponse(sse.finish(stream_interval.coalesce(events)), media_type="text/event-stream")

    async def events():
        chunk = _Chunks(request_id, model_id, created)
        try:
            yield "".join(chunk({"role": "assistant", "content": ""}, index=j) for j in range(n))
            while not group.finished:
                j, reply, taken = await group.next()
                text, failed = stream_step(chunk, reply, taken, j)
                if failed:
                    yield text
                    return
                if text:
                    yield text
                if reply.finished and not group.finished:
                    yield chunk({}, reply.finish_reason(), index=j)
            text, final = stream_end(chunk, reply, j, group.usage(), where)
            if text:
                yield text
            yield fingerprint.stamp_sse(final, _Ids(group.tokens()), request_id)
        finally:
            group.done()

    return StreamingResponse(sse.finish(stream_interval.coalesce(events())), media_type="text/event-stream")


def stream_step(chunk: _Chunks, reply: Reply, taken: list, j: int) -> tuple[str, bool]:
    """The events of one output of a streamed choice j, as one text, and whether the reply failed
    (its error event is then the text's last)."""
    sent, have = reply.logprobs_sent, len(reply.logprob_rows)
    fresh = reply.logprobs_json(sent, have) if have > sent else None
    reply.logprobs_sent = have
    deltas = reply.deltas(taken)
    if fresh and not deltas:
        deltas = [{}]
    parts = [chunk(d, logprobs=fresh if i == 0 else None, index=j) for i, d in enumerate(deltas)]
    if reply.error is not None:
        parts.append(sse.error_event(reply.error))
        return "".join(parts), True
    return "".join(parts), False


def stream_end(chunk: _Chunks, reply: Reply, j: int, usage: dict, where: str) -> tuple[str, str]:
    """A finished stream's end, given the last choice to finish: the events before the last, and
    the last (where the fingerprint goes)."""
    final = chunk({}, reply.finish_reason(), usage if where == "finish" else None, index=j)
    if where == "last":
        return final, chunk(None, usage=usage)
    return "", final


class _Ids:
    """What fingerprint.stamp_sse reads from a streamer: the generated ids."""

    def __init__(self, ids):
        self._pb_ids = ids
