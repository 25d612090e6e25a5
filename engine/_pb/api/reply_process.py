"""PB_REPLY_PROCESS (0720): a streamed chat reply's per-token work in a process of its own.

The batching loop's thread and the event loop's share one interpreter lock. Under 32 streams
on an H200 (W27, W28) the event loop's work for each token (the detokenizer, the GLM parser,
the logprobs entries, the chunk's JSON) held it while the batching loop waited for it and the
GPU idled: streamed logprobs (top 5) decoded at 0.83-0.87 of plain streams.

With the knob on, a streamed chat request of one choice hands that work to the reply process,
a child of the server started on first use (one per server). Once a step, the server sends it
the new token ids and log-probabilities of every such stream in one message; it answers with
every stream's events in one message, and the server's event loop only writes them out. The
events are rendered by the same code as with the knob off (`chat.stream_step`, `chat.stream_end`,
`reply.Reply`), in a context holding the request's knob overrides and vLLM fields, so the bytes
are the same. The server keeps what belongs to it: the token ids, the request's cleanup, the
fingerprint (stamped and logged as before) and the prefix-cache count its usage reports.

Messages are JSON (a length, then the text), never pickles: no process of the server unpickles
what another sends (tests/test_tp.py guards it). The tokenizer goes over as the files its
save_pretrained writes, in a temporary folder the reply process loads and removes.

If the reply process ends, each of its open streams ends with an error event and the next
request starts a new one; after MAX_DEATHS ends, or where it cannot start or cannot take the
request's tokenizer, streams are rendered in the server as with the knob off (logged once).
"""

import asyncio
import contextvars
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple

from ...utils import logging
from .. import knobs
from ..runtime import batched_sampler
from . import fingerprint, sse, usage, vllm_fields


logger = logging.get_logger(__name__)

_HEADER = struct.Struct("!I")  # each message: its JSON's length in bytes, then the JSON
MAX_DEATHS = 3  # reply processes that may end before the server renders its streams itself
_helper: "Helper | None" = None
_starting: "asyncio.Lock | None" = None
_deaths = 0


def on() -> bool:
    return bool(knobs.get("PB_REPLY_PROCESS"))


class Opening(NamedTuple):
    """What the reply process needs to render a stream (Reply's and _Chunks' arguments). Of the
    prompt only its length and last ids go over: a 35K-token prompt's ids took 4 ms of the event
    loop to write as JSON (W57: with 0770's shorter pieces, a resent 35K turn's admission 10.9 ->
    5.5 ms on a 2-core CPU)."""

    prompt_tail: list  # the prompt's last reply.PROMPT_TAIL ids
    prompt_len: int
    tools: object
    parse: bool
    padded: bool
    stops: tuple
    eos: object
    max_new_tokens: int | None
    model_id: str
    created: int
    where: str  # where its usage goes (shapes.usage_in_stream)


def _frame(message) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(len(data)) + data


async def open_stream(request_id: str, tokenizer, spec, opening: Opening) -> "Stream | None":
    """A stream rendered by the reply process (started here the first time), whose `take` is the
    request's result handler; None where the server must render it itself."""
    global _helper, _starting, _deaths
    if _deaths >= MAX_DEATHS:
        return None
    if _starting is None:
        _starting = asyncio.Lock()
    async with _starting:
        if _helper is None or _helper.dead:
            _helper = Helper()
            try:
                await _helper.start()
            except Exception as e:  # the interpreter cannot be started here, say
                _deaths = MAX_DEATHS
                logger.error(f"patchbay: the reply process did not start ({type(e).__name__}: {e}); streams are "
                             f"rendered in the server from now on")
                return None
        if id(tokenizer) not in _helper.tokenizers:
            await _helper.send_tokenizer(tokenizer)
    return _helper.open(request_id, tokenizer, spec, opening)


class Helper:
    """The reply process, as the server sees it."""

    def __init__(self):
        self.streams: dict[str, Stream] = {}
        # id -> (tokenizer, whether it was sent): held, so that an id is never another's
        self.tokenizers: dict[int, tuple] = {}
        self.pending: list = []  # (stream, output) taken since the last flush
        self.flushing = False
        self.dead = False

    async def start(self) -> None:
        parent, child = socket.socketpair()
        # The child imports this package as the server did: the server's own path, whatever
        # started it.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(child.fileno())],
                                     pass_fds=[child.fileno()], env=env)
        child.close()
        self.loop = asyncio.get_running_loop()
        self.reader, self.writer = await asyncio.open_connection(sock=parent)
        self.reading = self.loop.create_task(self._read())
        logger.info(f"patchbay: reply process {self.proc.pid} started")

    def _send(self, message) -> None:
        if not self.dead:
            self.writer.write(_frame(message))

    async def send_tokenizer(self, tokenizer) -> None:
        """The tokenizer's files to the reply process (written off the event loop), once."""
        key = id(tokenizer)
        folder = tempfile.mkdtemp(prefix="pb-reply-tokenizer-")
        try:
            await asyncio.to_thread(tokenizer.save_pretrained, folder)
        except Exception as e:  # a tokenizer that cannot be written out
            shutil.rmtree(folder, ignore_errors=True)
            logger.warning(f"patchbay: the reply process cannot take this tokenizer ({type(e).__name__}: {e}); "
                           f"its streams are rendered in the server")
            self.tokenizers[key] = (tokenizer, False)
            return
        self.tokenizers[key] = (tokenizer, True)
        self._send(("tokenizer", key, folder))

    def open(self, request_id: str, tokenizer, spec, opening: Opening) -> "Stream | None":
        key = id(tokenizer)
        if not self.tokenizers[key][1]:
            return None
        logprobs = (bool(spec.logprobs), spec.top_logprobs) if spec is not None else (False, 0)
        self._send(("open", request_id, key, opening, logprobs, knobs.request_overrides(), vllm_fields.taken()))
        stream = self.streams[request_id] = Stream(self, request_id, spec)
        return stream

    def flush(self) -> None:
        """Once a step, on the event loop: every stream's new tokens to the reply process."""
        self.flushing = False
        pending, self.pending = self.pending, []
        records = [stream.record(output) for stream, output in pending if not stream.closed]
        if records:
            self._send(("step", records))

    def close(self, stream: "Stream") -> None:
        stream.closed = True
        if self.streams.pop(stream.request_id, None) is not None:
            self._send(("close", stream.request_id))

    async def _read(self) -> None:
        try:
            while True:
                head = await self.reader.readexactly(_HEADER.size)
                for rendered in json.loads(await self.reader.readexactly(_HEADER.unpack(head)[0])):
                    # A finished stream is the reply process's no more; its events wait in its queue.
                    stream = self.streams.pop(rendered[0], None) if rendered[4] else self.streams.get(rendered[0])
                    if stream is not None:
                        stream.queue.put_nowait(rendered[1:])
        except (asyncio.IncompleteReadError, OSError) as e:
            self._died(f"reply process ended ({type(e).__name__})")
        except Exception as e:  # a message that would not parse: nothing more can be trusted
            self._died(f"reply process failed ({type(e).__name__}: {e})")
            raise

    def _died(self, why: str) -> None:
        global _deaths
        self.dead = True
        _deaths += 1
        then = ("the next stream starts another" if _deaths < MAX_DEATHS else
                f"that is {_deaths} ended; streams are rendered in the server from now on")
        logger.error(f"patchbay: {why}; its {len(self.streams)} open stream(s) end with an error; {then}")
        for stream in list(self.streams.values()):
            stream.queue.put_nowait((sse.error_event(why), None, 0, True))
        self.streams.clear()
        self.writer.close()
        if self.proc.poll() is None:
            self.proc.kill()


class Stream:
    """One offloaded stream, on the server's side."""

    def __init__(self, helper: Helper, request_id: str, spec):
        self.helper, self.request_id, self.spec = helper, request_id, spec
        self.tokens: list[int] = []  # as the engine reported them
        self.logprobs_sent = self.top_sent = 0
        self.finished = False  # the engine is done with the request
        self.closed = False
        self.queue: asyncio.Queue = asyncio.Queue()  # (text, last event or None, tokens it covers, done)

    def take(self, output) -> None:
        """The request's result handler (on the event loop): kept for the step's one message."""
        helper = self.helper
        helper.pending.append((self, output))
        if not helper.flushing:
            helper.flushing = True
            helper.loop.call_soon(helper.flush)  # after the rest of the step's outputs

    def record(self, output) -> tuple:
        new = [int(t) for t in output.generated_tokens[len(self.tokens):]]
        self.tokens += new
        spec, chosen, top = self.spec, None, None
        if spec is not None and spec.logprobs:
            batched_sampler.settle(spec, len(self.tokens))  # 0640 copies them a step late
            chosen = spec.chosen_logprobs[self.logprobs_sent:]
            self.logprobs_sent += len(chosen)
            if spec.top_logprobs:
                top = spec.top[self.top_sent:]
                self.top_sent += len(top)
        ends = output.is_finished()
        self.finished = self.finished or ends
        error = None if output.error is None else str(output.error)
        return (self.request_id, new, chosen, top, int(output.status), error,
                usage.cached(self.request_id) if ends else None)

    async def events(self, group, chunk, ids):
        """The stream's events: the role event from here, the rest as the reply process renders
        them. `group` is the request's Choices (its cleanup), `ids` wraps token ids for
        fingerprint.stamp_sse."""
        try:
            yield chunk({"role": "assistant", "content": ""}, index=0)
            while True:
                text, last, covered, done = await self.queue.get()
                if text:
                    yield text
                if last is not None:
                    yield fingerprint.stamp_sse(last, ids(self.tokens[:covered]), self.request_id)
                if done:
                    return
        finally:
            group.replies[0].finished = self.finished  # a request the engine still runs is cancelled
            group.done()
            self.helper.close(self)


# -- the reply process ---------------------------------------------------------------------


class _Rendering:
    """One stream in the reply process: its Reply and chunk writer, in the request's context."""

    def __init__(self, request_id: str, tokenizer, opening: Opening, logprobs: tuple, overrides, fields):
        self.request_id = request_id
        self.context = contextvars.Context()
        self.context.run(self._start, tokenizer, opening, logprobs, overrides, fields)

    def _start(self, tokenizer, opening: Opening, logprobs: tuple, overrides, fields) -> None:
        from ..runtime.sampler import Spec
        from . import chat
        from .reply import Reply

        # JSON brought the knobs' tuples (comma lists) as lists
        knobs.use_request_overrides(None if overrides is None else
                                    {k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items()})
        vllm_fields.use_taken(fields)
        spec = Spec(logprobs=True, top_logprobs=logprobs[1]) if logprobs[0] else None
        self.reply = Reply(self.request_id, tokenizer, opening.prompt_tail, opening.tools, None,
                           opening.max_new_tokens, spec=spec, stops=opening.stops, eos=opening.eos,
                           padded=opening.padded, parse=opening.parse, prompt_len=opening.prompt_len)
        self.chunk = chat._Chunks(self.request_id, opening.model_id, opening.created)
        self.where = opening.where
        self.tokens: list[int] = []
        self.cached = 0  # prompt tokens the server found in the prefix cache, as it last said

    def feed(self, record: tuple) -> tuple:
        """One step's record -> (request id, text, last event or None, tokens it covers, done)."""
        from ...generation.continuous_batching.requests import GenerationOutput, RequestStatus
        from . import chat

        _, new, chosen, top, status, error, cached = record
        self.tokens += new
        spec = self.reply.spec
        if chosen:
            spec.chosen_logprobs += chosen
        if top:
            spec.top += top
        if cached is not None:
            self.cached = cached
        output = GenerationOutput(request_id=self.request_id, generated_tokens=self.tokens, error=error,
                                  status=RequestStatus(status))
        try:
            text, failed = chat.stream_step(self.chunk, self.reply, self.reply.take(output), 0)
            if failed:
                return self.request_id, text, None, 0, True
            if self.reply.finished:
                end, last = chat.stream_end(self.chunk, self.reply, 0, self.reply.usage(self.cached), self.where)
                return self.request_id, text + end, last, len(self.reply.tokens), True
            return self.request_id, text, None, 0, False
        except Exception as e:  # one stream's failure ends that stream, not the others
            logger.exception(f"patchbay: reply process: rendering {self.request_id} failed")
            return self.request_id, sse.error_event(f"rendering the reply failed ({type(e).__name__})"), None, 0, True


def main(fd: int) -> None:
    """The reply process: messages from the server in, each step's events out. It ends when the
    server closes its end; it ignores SIGINT and SIGTERM, which a terminal or a stop sends to the
    server's whole process group, so that the server, not the signal, ends its streams."""
    import signal

    from . import reply

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = socket.socket(fileno=fd)
    source = conn.makefile("rb")
    tokenizers, streams = {}, {}
    while True:
        head = source.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return  # the server is gone
        message = json.loads(source.read(_HEADER.unpack(head)[0]))
        kind = message[0]
        if kind == "tokenizer":
            from ... import AutoTokenizer

            tokenizer = tokenizers[message[1]] = AutoTokenizer.from_pretrained(message[2])
            shutil.rmtree(message[2], ignore_errors=True)
            threading.Thread(target=reply.warm, args=(tokenizer,), name="pb-token-entries", daemon=True).start()
        elif kind == "open":
            _, request_id, key, opening, logprobs, overrides, fields = message
            streams[request_id] = _Rendering(request_id, tokenizers[key], Opening(*opening), logprobs, overrides,
                                             fields)
        elif kind == "close":
            streams.pop(message[1], None)
        elif kind == "step":
            out = []
            for record in message[1]:
                rendering = streams.get(record[0])
                if rendering is None:
                    continue  # closed by the server while this step was on its way
                rendered = rendering.context.run(rendering.feed, record)
                out.append(rendered)
                if rendered[4]:
                    del streams[record[0]]
            if out:
                conn.sendall(_frame(out))


if __name__ == "__main__":
    main(int(sys.argv[1]))
