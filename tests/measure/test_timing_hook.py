import math

from patchbay import ROOT
from patchbay.measure.tools import timeline, timing_hook

from .helpers import run_with_hooks

ENGINE = '''
import asyncio
import torch

class IOs:
    def __init__(self):
        self.bulk = torch.ones((7, 64), dtype=torch.int32)

    def reset(self, q):
        self.bulk[:, : q + 1].zero_()
        self.bulk[3:] = 5
        return self.bulk.sum()

    def prepare(self, q):
        return self.reset(q) + 1

async def handle():
    await asyncio.sleep(0.01)
    return IOs().prepare(8)
'''
CALLS = '''
import asyncio, torch
import fakeengine.batching as b
assert b.IOs().prepare(8) == 3 * 55 + 4 * 64 * 5 + 1
torch.zeros(3).zero_()  # outside reset: not recorded
asyncio.run(b.handle())
'''


def test_the_hook_times_the_calls_and_the_tensor_writes_inside_as_sitecustomize(tmp_path):
    (tmp_path / "fakeengine").mkdir()
    (tmp_path / "fakeengine" / "__init__.py").write_text("")
    (tmp_path / "fakeengine" / "batching.py").write_text(ENGINE)
    log = tmp_path / "part" / "hook.tsv"
    proc = run_with_hooks(CALLS, tmp_path, tmp_path, HOSTPROF_LOG=str(log), HOSTPROF_RECORD="calls,ops",
                          HOSTPROF_TARGETS="fakeengine.batching:IOs.prepare,fakeengine.batching:IOs.reset,"
                                           "fakeengine.batching:handle,fakeengine.batching:IOs.gone",
                          HOSTPROF_OPS_INSIDE="fakeengine.batching:IOs.reset")
    assert "fakeengine.batching.IOs.gone not found" in proc.stderr
    calls = timeline.read_hook(log.read_text())
    names = [c.name for c in calls]
    # the first prepare: its reset's two writes, the reset (one deep), the prepare; then the coroutine
    assert names[:4] == ["OP batching.IOs.reset zero_ shape=(7, 9) int32 cpu",
                         "OP batching.IOs.reset __setitem__ [3:] shape=(7, 64) int32 cpu",
                         "batching.IOs.reset", "batching.IOs.prepare"]
    assert names[-1] == "batching.handle" and names.count("batching.IOs.reset") == 2
    by = {c.name: c for c in calls}
    assert by["batching.IOs.reset"].depth == 1 and by["batching.IOs.prepare"].depth == 0
    assert math.isnan(by["batching.handle"].cpu_ms) and by["batching.handle"].wall_ms >= 10
    assert all(c.start <= c.end for c in calls)
    # the hook said what it ran beside its log
    line, = (tmp_path / "part" / "command.txt").read_text().splitlines()
    assert line.startswith("HOSTPROF_LOG=") and "HOSTPROF_RECORD=calls,ops" in line
    assert line.endswith("(sitecustomize hook patchbay.measure.tools.timing_hook, build unknown)")


def test_without_its_variable_the_hook_patches_nothing(tmp_path):
    proc = run_with_hooks("import sys; from transformers.generation.continuous_batching import continuous_api as c;"
                          "print(c.ContinuousBatchingManager.add_request.__code__.co_filename)", tmp_path)
    assert "continuous_api.py" in proc.stdout


def test_a_bad_target_spec_is_refused():
    try:
        timing_hook.parse_targets("just.a.module")
    except ValueError as e:
        assert "module:Qual.name" in str(e)
    else:
        raise AssertionError("accepted a target without a qualified name")
    assert timing_hook.parse_targets("a.b:C.f,a.b:g, c:h") == {"a.b": ["C.f", "g"], "c": ["h"]}


def hook_line(end, name, wall_ms, depth=0):
    return f"{end:.6f}\tuvicorn-thread\t{name}\t{wall_ms:.4f}\t{wall_ms:.4f}\t{depth}"


def test_the_timeline_puts_each_mark_against_the_requests_send():
    lines, requests = [], []
    for i, send in enumerate((100.0, 200.0, 300.0)):
        first = send + 0.170
        lines += [hook_line(send + 0.100, "chat_completion.ChatCompletionHandler.handle_request", 98 + i),  # in at +2-i ms
                  hook_line(send + 0.018, "tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template", 15, 1),
                  hook_line(send + 0.019, "continuous_api.ContinuousBatchingManager.add_request", 0.5, 1),
                  hook_line(send + 0.040, "continuous_api.ContinuousBatchingManager._generation_step", 12),
                  hook_line(send + 0.050, "continuous_api.ContinuousBatchProcessor.update_batch", 1),
                  hook_line(send + 0.168, "continuous_api.ContinuousBatchProcessor.update_batch", 100),
                  hook_line(send + 5.0, "continuous_api.ContinuousBatchProcessor.update_batch", 200)]  # after
        requests.append((send, first, send + 0.2))
    text = timeline.table(timeline.read_hook("\n".join(lines)), requests, warmup=1)
    rows = [line.split(" | ") for line in text.splitlines()[2:]]
    assert "median of 2" in text.splitlines()[0]
    at = {r[0].strip("| "): float(r[1]) for r in rows}
    assert at == {"HTTP in: the handler starts": 0.5, "chat template and tokenization done": 18.0,
                  "request handed to the batching loop": 19.0, "the prompt's step launched": 28.0,
                  "the prompt's step done (its token on the host)": 168.0, "first token at the client": 170.0}


def test_the_timeline_reproduces_w09s_table_from_its_records(tmp_path):
    part = ROOT / "results" / "W09-prefill-h200" / "api-ttft-timeline"
    assert timeline.main([str(part), "--out", str(tmp_path / "table.md")]) == 0
    assert (tmp_path / "table.md").read_text() == (part / "table.md").read_text()
    assert (tmp_path / "command.txt").read_text().startswith("python -m patchbay.measure.tools.timeline ")
