"""The `n` choices of one chat request (PB_VLLM_FIELDS; 1 otherwise), as continuous-batching requests.

Choice 0 keeps the request's own id; choice j is `<id>.<j>`. The others go in once choice 0's
first token is out: its prompt's complete KV blocks are then in the paged cache, and upstream's
prefix sharing gives them to the others instead of computing them again (`cached_tokens`). A
seeded request's choice j samples with its own seed derived from the request's (`seed_for`), so
the choices differ and each is reproducible; /v1/completions (0620) derives its choices' seeds alike.
"""

import asyncio
import dataclasses
import hashlib

from ..runtime import sampler
from ..runtime.let_go import let_go
from . import usage


def seed_for(seed: int, j: int) -> int:
    """Choice j's seed: the request's own for choice 0, a hash of (seed, j) for the others, so no
    choice shares its seed with another request's choice (as seed + j would)."""
    if j == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}/{j}".encode()).digest()[:8], "big") % (1 << 63)


def derive(spec, j: int):
    """Choice j's settings: the request's, a fresh run state, and its own seed."""
    if spec is None or j == 0:
        return spec
    seed = None if spec.seed is None else seed_for(spec.seed, j)
    return dataclasses.replace(spec, seed=seed, tokens=[], chosen_logprobs=[], top=[], generator=None)


class Choices:
    def __init__(self, cb, request_id: str, n: int, spec, make_reply, input_ids, max_new_tokens, eos,
                 handler=None):
        """`handler` takes the outputs instead of `next` (0720's reply process; one choice)."""
        self.cb, self.input_ids, self.max_new_tokens, self.eos = cb, input_ids, max_new_tokens, eos
        self.handler = handler
        self.ids = [request_id] + [f"{request_id}.{j}" for j in range(1, n)]
        self.specs = [derive(spec, j) for j in range(n)]
        self.replies = [make_reply(rid, s) for rid, s in zip(self.ids, self.specs)]
        self.index = {rid: j for j, rid in enumerate(self.ids)}
        self.queue: asyncio.Queue = asyncio.Queue()
        self.submitted = 0
        self._submit(1)

    def _submit(self, upto: int) -> None:
        for j in range(self.submitted, upto):
            rid, spec = self.ids[j], self.specs[j]
            if spec is not None:
                sampler.register(rid, spec)
            self.cb.register_result_handler(rid, self.handler or self.queue.put_nowait)
            self.cb.add_request(self.input_ids, request_id=rid, streaming=True, max_new_tokens=self.max_new_tokens,
                                eos_token_id=self.eos)
        self.submitted = max(self.submitted, upto)

    @property
    def finished(self) -> bool:
        return all(r.finished for r in self.replies)

    async def next(self) -> tuple:
        """The next output of any choice, taken: (j, its reply, its events)."""
        output = await self.queue.get()
        j = self.index[output.request_id]
        reply = self.replies[j]
        events = reply.take(output)
        if j == 0:  # choice 0 is past its prompt (or finished): the others may share its blocks
            self._submit(len(self.ids))
        return j, reply, events

    def error(self) -> str | None:
        return next((r.error for r in self.replies if r.error is not None), None)

    def tokens(self) -> list:
        """What the fingerprint hashes: every choice's tokens, in order."""
        return [t for r in self.replies for t in r.tokens]

    def usage(self) -> dict:
        """One request's usage: the prompt once, every choice's reply tokens; cached_tokens is the
        most any choice read from the cache."""
        if len(self.replies) == 1:
            return self.replies[0].usage()
        parts = [r.usage() for r in self.replies]
        completion = sum(p["completion_tokens"] for p in parts)
        prompt = parts[0]["prompt_tokens"]
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": max(p["prompt_tokens_details"]["cached_tokens"]
                                                               for p in parts)},
                "completion_tokens_details": {"reasoning_tokens": sum(
                    p["completion_tokens_details"]["reasoning_tokens"] for p in parts)}}

    def done(self) -> None:
        for rid, reply in zip(self.ids[:self.submitted], self.replies):
            sampler.release(rid)
            usage.release(rid)
            if reply.stopped or not reply.finished:
                let_go(self.cb, rid)
        for reply in self.replies[self.submitted:]:
            usage.release(reply.request_id)
