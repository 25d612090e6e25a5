"""Tensor-parallel serving (patch 0200, PB_TENSOR_PARALLEL; TP=2 on the local runtime).

Real engines on the tiny model, two real gloo ranks on this machine, started and stopped
through patchbay's launcher and CLI; no mocks. TP=2 vs TP=1: the ranks split each matmul and
sum the parts, which reorders float sums, so logits are not bit-identical. The checks are
therefore (a) the greedy token ids of every exactness prompt through the HTTP API are equal
(compared by `pb_fingerprint`, a hash of the token ids, and by text), and (b) teacher-forced
|Δ logprob| of the reference texts stays at float32 rounding level (measured: max 9.5e-7).

The ranks of `tp_server` run with tests/tp_guard first on their path, which logs every
unpickling a rank does: what one rank sends another must never go through pickle.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from patchbay.measure import exact
from patchbay.runtime import launch
from patchbay.series import build

from .conftest import ALL_ON, INTERPRETER_ENV, LOCAL, engine_environ, engine_job, free_port
from .runtime.test_launch import assert_one_line_error, patchbay, write_config

pytestmark = pytest.mark.engine

TP_KNOBS = {**ALL_ON, "PB_TENSOR_PARALLEL": "1", "PB_FORCED_DECODING": "1"}


def tp_config(run_dir, **changes):
    return dataclasses.replace(LOCAL, port=free_port(), rdzv_port=free_port(), tp=2, knobs=TP_KNOBS,
                               run_dir=str(run_dir), **changes)


GUARD = Path(__file__).with_name("tp_guard")
ADMIN_KEY = "tp-admin-key"
UNPICKLED = "unpickled.log"  # in the run folder: tests/tp_guard's log of every unpickling


@dataclasses.dataclass
class GuardedEngine:
    """The patched engine with tests/tp_guard first on each rank's path, logging to `log`."""
    engine: build.Engine
    log: Path

    @property
    def build_id(self) -> str:
        return self.engine.build_id

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": os.pathsep.join([str(GUARD), str(self.engine.site)]), "TP_GUARD_LOG": str(self.log)}


@pytest.fixture(scope="module")
def tp_server(patched_engine, tiny_model, tmp_path_factory):
    run = tmp_path_factory.mktemp("run-tp2")
    (run / "admin-key").write_text(f"{ADMIN_KEY}\n")  # 0550: the admin routes exist only with a key
    cfg = tp_config(run, admin_key_file=str(run / "admin-key"))
    files = launch.RunFiles(cfg.run_path)
    launch.start(cfg, GuardedEngine(patched_engine, cfg.run_path / UNPICKLED), tiny_model, files,
                 progress=lambda *_: None)
    yield cfg
    launch.stop(files)


def greedy(url: str, model: str, messages: list[dict]) -> tuple[str, str]:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=300,
                   json={"model": model, "messages": messages, "max_tokens": exact.NEW_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"][0]["message"]["content"], body["pb_fingerprint"]


def test_column_shards_stay_apart_without_0340(tp_server):
    files = launch.RunFiles(tp_server.run_path)
    for rank in (0, 1):
        log = files.rank_log(rank).read_text()
        assert "PB_FUSED_PROJ: fused q/k/v in 0 attention layers and gate/up in 0 MLPs (4 left" in log, log[-2000:]


def test_with_0340_each_rank_fuses_its_own_column_shards_and_replies_as_tp1(patched_engine, tiny_model, server_on,
                                                                           tmp_path):
    cfg = dataclasses.replace(tp_config(tmp_path / "run"), knobs={**TP_KNOBS, "PB_FUSED_PROJ_TP": "1"})
    files = launch.RunFiles(cfg.run_path)
    launch.start(cfg, patched_engine, tiny_model, files, progress=lambda *_: None)
    try:
        for rank in (0, 1):
            log = files.rank_log(rank).read_text()
            assert ("PB_FUSED_PROJ: fused q/k/v in 2 attention layers and gate/up in 2 MLPs, 4 of them "
                    "tensor-parallel column shards fused on this rank's rows (0 left") in log, (rank, log[-2000:])
        for messages in exact.EXACTNESS_PROMPTS[:3]:
            assert greedy(cfg.url, tiny_model, messages)[0] == greedy(server_on.url, tiny_model, messages)[0]
    finally:
        launch.stop(files)


def test_tp2_greedy_replies_equal_tp1(tp_server, server_on, tiny_model):
    """Same build, same adopted knobs; only TP differs. Token ids equal on all 8 prompts."""
    for i, messages in enumerate(exact.EXACTNESS_PROMPTS):
        two = greedy(tp_server.url, tiny_model, messages)
        one = greedy(server_on.url, tiny_model, messages)
        assert two == one, f"prompt {i}: TP=2 {two} != TP=1 {one}"


def test_tp2_teacher_forced_logprobs_match_tp1(patched_engine, tiny_model):
    env = launch.engine_env(patched_engine, {})
    one = exact.score_engine(env, tiny_model)
    two = exact.score_engine_tp(env, tiny_model, ranks=2, rdzv_port=free_port())
    rows = exact.logprob_deltas(one, two)
    print("TP=2 vs TP=1 teacher-forced |Δ logprob|:", rows)
    assert sum(r["tokens"] for r in rows) > 1000
    assert max(r["max_abs"] for r in rows) < 1e-4  # float32 rounding, not a different model


def test_rank0s_per_request_choices_reach_every_rank(tp_server, patched_engine, tiny_model, tmp_path):
    """Forced replies and seeded sampling are registered on rank 0 only; the followers must
    continue from the same tokens, or the pair computes with two different KV caches and the
    logprobs of the forced reply (and every later token) drift from TP=1's."""
    from .conftest import Server

    one = Server(patched_engine, tiny_model, {**ALL_ON, "PB_FORCED_DECODING": "1"}, tmp_path / "run-one")
    try:
        text = "def main():\n    return sorted(set(items), key=len)\n"
        body = {"model": tiny_model, "messages": exact.EXACTNESS_PROMPTS[0], "max_tokens": 64,
                "pb_forced": {"text": text}}
        def logprobs(url):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            return [e["logprob"] for e in r.json()["choices"][0]["logprobs"]["content"]]
        a, b = logprobs(tp_server.url), logprobs(one.url)
        assert len(a) == len(b) > 10 and max(abs(x - y) for x, y in zip(a, b)) < 1e-4
        seeded = {"model": tiny_model, "messages": exact.EXACTNESS_PROMPTS[1], "max_tokens": 24,
                  "temperature": 1.0, "seed": 11}
        replies = [httpx.post(f"{url}/v1/chat/completions", json=seeded, timeout=300).json()["pb_fingerprint"]
                   for url in (tp_server.url, one.url)]
        assert replies[0] == replies[1]
    finally:
        one.stop()


def test_tp2_drafts_alike_on_every_rank_and_replies_as_without_drafts(patched_engine, trained_model, tmp_path):
    """0800 and 0820 under tensor parallel: every rank must draft the same tokens for the same
    requests in the same steps (the drafts come from each rank's copy of the reply, the limit from
    each rank's scheduler, which rank 0's step payloads keep alike), or the ranks' batches differ
    and their collectives hang. synthetic:trained, edit prompts: greedy and seeded sampled replies
    with drafts are those without (`pb_knobs` turning drafting off); three requests at once (past
    PB_DRAFT_STREAMS=2) reply as alone; /metrics counts kept drafts."""
    import inspect
    import textwrap

    from .test_drafts import EDIT

    knobs = {**TP_KNOBS, "PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "2"}
    cfg = dataclasses.replace(tp_config(tmp_path / "run"), knobs=knobs)
    files = launch.RunFiles(cfg.run_path)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in INTERPRETER_ENV.items():  # rows' bits do not depend on the rows beside them
            mp.setenv(name, value)
        launch.start(cfg, patched_engine, trained_model, files, progress=lambda *_: None)
    try:
        sources = [EDIT + textwrap.dedent(inspect.getsource(f)) for f in (textwrap.dedent, textwrap.indent,
                                                                          inspect.cleandoc)]

        def reply(source: str, drafts: bool, **sampling) -> str:
            body = {"model": trained_model, "messages": [{"role": "user", "content": source}], "max_tokens": 40,
                    "ignore_eos": True, **sampling}
            if not drafts:
                body["pb_knobs"] = {"PB_DRAFT_TOKENS": 0}
            r = httpx.post(f"{cfg.url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            message = r.json()["choices"][0]["message"]
            return (message.get("reasoning_content") or "") + "|" + (message["content"] or "")

        def kept() -> float:
            metrics = httpx.get(f"{cfg.url}/metrics", timeout=30).text
            return float(next((line.split()[1] for line in metrics.splitlines()
                               if line.startswith("pb_draft_accepted_total ")), "-1"))

        for sampling in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 5}):
            plain = reply(sources[0], False, **sampling)
            before = kept()
            assert reply(sources[0], True, **sampling) == plain, sampling
            assert kept() > before >= 0
        alone = [reply(source, False, temperature=0) for source in sources]
        with ThreadPoolExecutor(3) as pool:
            together = list(pool.map(lambda source: reply(source, True, temperature=0), sources))
        assert together == alone
        ranks = launch.rank_states(files)
        assert len(ranks) == 2 and all(r["alive"] for r in ranks.values()), ranks
    finally:
        launch.stop(files)


def test_tp2_streams_through_rank0_and_follower_has_no_port(tp_server):
    files = launch.RunFiles(tp_server.run_path)
    info = launch.running(files)
    assert sorted(info["ranks"]) == [0, 1] and all(r["alive"] for r in info["ranks"].values())
    assert launch.health(tp_server.url) == "ok"
    assert httpx.get(f"{tp_server.url}/health", timeout=5).json()["ranks"] == {"world_size": 2, "peer_lost": None}
    # gloo listens on ports of its own; the HTTP port belongs to rank 0, and only rank 0 ran uvicorn.
    listening = subprocess.run(["ss", "-ltnpH", f"sport = :{tp_server.port}"], capture_output=True, text=True).stdout
    assert f"pid={info['ranks'][0]['pid']}," in listening and f"pid={info['ranks'][1]['pid']}," not in listening
    assert "Uvicorn running" in files.rank_log(0).read_text()
    assert "Uvicorn running" not in files.rank_log(1).read_text()
    log1 = files.rank_log(1).read_text()
    assert "rank 1 of 2, gloo" in log1 and "follows rank 0's batches" in log1


def test_the_guard_logs_torchs_unpickling_too(tmp_path):
    """tests/tp_guard sees pickle.loads and the unpickler torch.distributed's object collectives
    use (`broadcast_object_list`, which upstream's TP driver sends each step's requests with)."""
    code = ("import io, pickle\nfrom torch.distributed import distributed_c10d as c10d\n"
            "pickle.loads(pickle.dumps(1))\nc10d._unpickler(io.BytesIO(pickle.dumps(2))).load()\n")
    log = tmp_path / UNPICKLED
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(GUARD), "TP_GUARD_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = log.read_text().splitlines()
    assert [line.split(" [")[0] for line in lines] == ["rank -: pickle.loads", "rank -: pickle.Unpickler.load"], lines


def test_no_rank_unpickles_what_another_sends_while_serving(tp_server, tiny_model):
    """New requests one at a time and several in one step, a stream the client drops (a
    cancellation), then more: the configs and every step's payload reached rank 1 without a
    single unpickling on either rank (tests/tp_guard logs each one, with where it came from)."""
    for messages in exact.EXACTNESS_PROMPTS[:2]:
        greedy(tp_server.url, tiny_model, messages)
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda m: greedy(tp_server.url, tiny_model, m), exact.EXACTNESS_PROMPTS[2:6]))
    assert len(replies) == 4
    body = {"model": tiny_model, "messages": exact.EXACTNESS_PROMPTS[6], "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{tp_server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    greedy(tp_server.url, tiny_model, exact.EXACTNESS_PROMPTS[7])
    files = launch.RunFiles(tp_server.run_path)
    assert "follows rank 0's batches" in files.rank_log(1).read_text()
    log = tp_server.run_path / UNPICKLED
    unpickled = log.read_text() if log.exists() else ""
    assert unpickled == "", f"ranks unpickled while serving:\n{unpickled[:3000]}"


def listeners(pid: int) -> list[str]:
    """The local addresses (ADDR:PORT) that process pid listens on, from `ss`."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3] for line in out.splitlines() if f"pid={pid}," in line]


def test_rendezvous_store_and_gloo_listen_on_master_addr_only(tp_server):
    """torch's env:// store listened on every interface (`*:RDZV_PORT`); rank 0's now listens on
    MASTER_ADDR (127.0.0.1 for the local runtime), and gloo binds the loopback on both ranks."""
    info = launch.running(launch.RunFiles(tp_server.run_path))
    rank0, rank1 = (listeners(info["ranks"][r]["pid"]) for r in (0, 1))
    assert f"127.0.0.1:{tp_server.rdzv_port}" in rank0, rank0
    assert not [a for a in rank0 + rank1 if not a.startswith("127.0.0.1:")], (rank0, rank1)
    for rank in (0, 1):
        assert "GLOO_SOCKET_IFNAME=lo" in launch.RunFiles(tp_server.run_path).rank_log(rank).read_text()


def rank_pair(patched_engine, case: str, tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """tests/tp_wire_job.py as two gloo ranks: rank 0 sends CASE, rank 1 (tests/tp_guard on its
    path) receives it through upstream's DistributedHelper with the knob on."""
    port, job = free_port(), str(Path(__file__).with_name("tp_wire_job.py"))
    env = engine_environ(patched_engine, PB_TENSOR_PARALLEL="1")
    guard_log = tmp_path / UNPICKLED
    guarded = {**env, "PYTHONPATH": os.pathsep.join([str(GUARD), env["PYTHONPATH"]]), "TP_GUARD_LOG": str(guard_log)}
    procs = [subprocess.Popen([sys.executable, job, "rank", str(r), str(port), case], env=e, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r, e in ((0, env), (1, guarded))]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    unpickled = guard_log.read_text() if guard_log.exists() else ""
    assert unpickled == "", f"rank 1 unpickled:\n{unpickled}"
    return done


def test_a_step_payload_crosses_between_ranks_as_plain_data(patched_engine, tmp_path):
    rank0, rank1 = rank_pair(patched_engine, "states", tmp_path)
    assert rank0.returncode == 0 and rank1.returncode == 0, rank0.stderr[-2000:] + rank1.stderr[-2000:]
    sent, got = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (rank0, rank1))
    assert sent["same_objects"]  # rank 0 keeps its own states, as upstream's broadcast returns them
    assert got["states"] == sent["states"] and got["cancelled"] == ["req_3"]


@pytest.mark.parametrize("case,words", [
    ("pickle", "rank 0's step payload is not JSON"),
    ("badtype", "request 0.max_new_tokens: '9' is not int | None"),
    ("sizes", "sizes 1099511627776 bytes, 3 tokens are out of range"),
])
def test_a_malformed_step_payload_is_refused_and_the_follower_exits(patched_engine, case, words, tmp_path):
    """Bytes that are not what rank 0's encoder sends (a pickle among them, which upstream's
    follower would have run) stop rank 1 with one line naming what is wrong, unpickled."""
    rank0, rank1 = rank_pair(patched_engine, case, tmp_path)
    assert rank0.returncode == 0, rank0.stderr[-2000:]
    assert rank1.returncode == 1 and rank1.stdout == "", rank1.stderr[-2000:]
    lines = [line for line in rank1.stderr.splitlines() if "refuses what rank 0 sent" in line]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in rank1.stderr, rank1.stderr[-2000:]


def test_wire_encodings_rebuild_rank0s_objects_and_refuse_the_rest(patched_engine):
    result = engine_job("tp_wire_job.py", patched_engine, "codec", PB_TENSOR_PARALLEL="1")
    assert result["states_equal"] == [True, True] and result["cancelled"] == ["req_3"], result
    assert result["drafts"] == [[6, False], []], result  # 0800: what a request may draft crosses with it
    assert "pb_draft must be [drafts 1-16" in result["step_refusals"]["draft too many"]
    assert result["gen_equal"] and result["cb_equal"] and result["none_cb"], result
    for group in ("step_refusals", "config_refusals", "encode_refusals"):
        accepted = [name for name, message in result[group].items() if message == "ACCEPTED"]
        assert not accepted, f"{group}: accepted {accepted}: {result[group]}"
    assert "is not JSON" in result["step_refusals"]["pickle"] and "is not JSON" in result["config_refusals"]["pickle"]
    assert "unexpected fields ['__reduce__']" in result["step_refusals"]["extra field"]
    assert "field position_offset is 3" in result["encode_refusals"]["stale state"]


def test_cli_tp2_status_logs_kill_rank1_gives_503_stop_leaves_nothing(tmp_path, patched_engine, tiny_model):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, port=free_port(), rdzv_port=free_port(), tp=2, pb_tensor_parallel=1,
                       run_dir=str(run))
    started = patchbay("start", "--config", cfg)
    try:
        assert started.returncode == 0, started.stderr
        assert "PB_TENSOR_PARALLEL=1" in started.stdout
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 0, status.stderr
        assert "rank 0" in status.stdout and "rank 1" in status.stdout and "health    ok" in status.stdout
        logs = patchbay("logs", "1", "--config", cfg, "-n", "1000")
        assert "rank 1 of 2" in logs.stdout
        info = launch.running(launch.RunFiles(run))
        url = info["url"]

        os.kill(info["ranks"][1]["pid"], 9)
        killed = time.monotonic()
        health, chat = [], []
        while time.monotonic() - killed < 5 and not (health and health[-1][0] == 503 and "tp_peer_lost" in health[-1][1]):
            try:
                r = httpx.get(f"{url}/health", timeout=1)
                health.append((r.status_code, r.text))
            except httpx.HTTPError as e:
                health.append((type(e).__name__, ""))
            time.sleep(0.1)
        took = time.monotonic() - killed
        # Over gloo the CB loop's own collective may fail first (upstream's cb_worker_dead, also 503);
        # the heartbeat's tp_peer_lost must follow, as it is what catches a peer that hangs (NCCL).
        assert all(code in (200, 503) for code, _ in health), health
        assert health[-1][0] == 503 and "tp_peer_lost" in health[-1][1], f"no tp_peer_lost 503 within 5 s: {health}"
        print(f"health 503 (tp_peer_lost) {took:.2f}s after rank 1 was killed")
        r = httpx.post(f"{url}/v1/chat/completions", timeout=5,
                       json={"model": tiny_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 503 and "tensor-parallel peer rank is gone" in r.text
        status = patchbay("status", "--config", cfg)
        assert "DEAD" in status.stdout and "503" in status.stdout
    finally:
        stopped = patchbay("stop", "--config", cfg)
    assert stopped.returncode == 0 and "stopped pids" in stopped.stdout
    assert patchbay("status", "--config", cfg).returncode == 3
    assert not list(run.glob("*.pid"))
    for pid in info["ranks"].values():
        assert not launch._alive(pid["pid"])


def test_start_is_atomic_on_readiness_timeout(tmp_path, patched_engine, tiny_model):
    cfg = tp_config(tmp_path / "run", ready_timeout=2)
    files = launch.RunFiles(cfg.run_path)
    with pytest.raises(launch.LaunchError) as e:
        launch.start(cfg, patched_engine, tiny_model, files, progress=lambda *_: None)
    assert "every rank was stopped" in str(e.value)
    assert "--- rank 0" in str(e.value) and "--- rank 1" in str(e.value)
    assert launch.running(files) is None and not list(files.dir.glob("*.pid"))


@pytest.mark.parametrize("env,words", [
    ({}, ["RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT missing from the environment"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, ["MASTER_PORT missing"]),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     ["RANK=2 must be below WORLD_SIZE=2"]),
    ({"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     ["cannot split", "num_attention_heads=4 is not divisible by 3"]),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "198.51.100.7", "MASTER_PORT": "29500"},  # TEST-NET-2
     ["rank 0 cannot listen on MASTER_ADDR=198.51.100.7 port 29500", "must be an address of rank 0's host"]),
])
def test_engine_refuses_bad_tp_env_in_one_line(patched_engine, tiny_model, env, words):
    """Whoever starts the engine (patchbay, Docker, torchrun): one line, exit 2, before any rank joins."""
    proc = subprocess.run(launch.engine_command(LOCAL, tiny_model),
                          env={**launch.engine_env(patched_engine, {"PB_TENSOR_PARALLEL": "1"}), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    refusals = [line for line in proc.stderr.splitlines() if "refusing to start" in line]
    assert len(refusals) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for word in words:
        assert word in refusals[0]


def test_bad_tp_config_is_one_line(tmp_path):
    cfg = write_config(tmp_path, port=free_port(), tp=2, run_dir=str(tmp_path / "run"))
    assert_one_line_error(patchbay("start", "--config", cfg), 2, "TP=2 needs PB_TENSOR_PARALLEL=1")


def test_hung_rank1_fails_requests_in_flight_and_answers_503(tmp_path, patched_engine, tiny_model):
    """A peer that hangs (SIGSTOP) closes no socket: only the heartbeat's timeout can notice it. The
    stream in flight ends with an error, health and new requests answer 503 within 5 s; once the
    peer runs again it finds rank 0 gone from the heartbeat and exits on its own."""
    cfg = tp_config(tmp_path / "run")
    files = launch.RunFiles(cfg.run_path)
    info = launch.start(cfg, patched_engine, tiny_model, files, progress=lambda *_: None)
    follower = info["ranks"][1]["pid"]
    try:
        body = {"model": tiny_model, "messages": [{"role": "user", "content": "Tell me a long story."}],
                "max_tokens": 4000, "stream": True,
                "pb_knobs": {"PB_OPENAI_SHAPES": 0}}  # 0030 shortens it to the room left (0610 would refuse it)
        with httpx.stream("POST", f"{cfg.url}/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # the stream is under way
            os.kill(follower, signal.SIGSTOP)
            hung = time.monotonic()
            rest = list(lines)  # must end, not hang (the client's read timeout is 30 s)
        ended = time.monotonic() - hung
        assert ended < 5, f"the stream in flight ran on {ended:.1f}s after rank 1 hung"
        assert any("error" in line for line in rest), rest[-3:]
        while time.monotonic() - hung < 5 and "tp_peer_lost" not in httpx.get(f"{cfg.url}/health").text:
            time.sleep(0.1)
        r = httpx.get(f"{cfg.url}/health")
        assert r.status_code == 503 and "tp_peer_lost" in r.text, f"{time.monotonic() - hung:.1f}s: {r.text}"
        print(f"rank 1 hung: stream ended after {ended:.2f}s, health 503 after {time.monotonic() - hung:.2f}s")
        os.kill(follower, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and launch._alive(follower):
            time.sleep(0.2)
        assert not launch._alive(follower), "rank 1 outlived rank 0's heartbeat"
        assert "rank 0 is gone" in files.rank_log(1).read_text()
    finally:
        launch.stop(files)


@pytest.mark.parametrize("path", ["/v1/systemone", "/reset", "/load_model"])
def test_rank0_only_routes_answer_501_and_leave_the_pair_serving(tp_server, tiny_model, path):
    """These would run or reload the model on rank 0 alone; rank 1 would never join: refused."""
    r = httpx.post(f"{tp_server.url}{path}", json={"model": tiny_model, "messages": [], "input": "x"}, timeout=10,
                   headers={"Authorization": f"Bearer {ADMIN_KEY}"} if path in ("/reset", "/load_model") else {})
    assert r.status_code == 501 and "not available with tensor parallelism" in r.text
    assert launch.first_streamed_token(tp_server.url, tiny_model)
