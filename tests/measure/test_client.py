import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from patchbay.measure import bench, prompts
from patchbay.measure.tools import client, stalls

# A stand-in for the engine's chat endpoint: two streamed pieces, 50 ms apart, then the usage block.
CHUNKS = [{"choices": [{"delta": {"content": "Hel"}}]}, {"choices": [{"delta": {"content": "lo"}}]},
          {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"completion_tokens": 2, "prompt_tokens": 9}}]


class Chat(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        Chat.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in CHUNKS:
            time.sleep(0.05)
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Chat.bodies.clear()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def plan_for(url, **kw):
    chosen = prompts.select(["prefill"])[:1]
    return bench.Plan(url=url, model="m", arms={"A": {}, "B": {}}, prompts=chosen, levels=[1], reps=1, warmup=0,
                      max_tokens=4, timeout=10, **kw), chosen[0]


def test_cold_requests_write_send_first_and_end_on_the_wall_clock(server, tmp_path):
    plan, prompt = plan_for(server, cold=True)
    out = tmp_path / "client-times.tsv"
    before = time.time()
    with httpx.Client() as http:
        recs = client.cold_requests(http, plan, prompt, 2, out, pause=0.01, say=lambda _: None)
    after = time.time()
    lines = [tuple(map(float, line.split())) for line in out.read_text().splitlines()]
    assert len(lines) == 2 and all(r["error"] is None for r in recs)
    for send, first, end in lines:
        assert before <= send < first < end <= after  # time.time(), the timing hook's clock
        assert first - send >= 0.05 and end - first >= 0.05
    # each request opened with its own line: nothing cached between them
    firsts = [body["messages"][0]["content"].split("\n")[0] for body in Chat.bodies]
    assert len(set(firsts)) == 2 and all(f.startswith("Request ") for f in firsts)
    assert client.decode_rate(recs[0]) == pytest.approx(1 / (recs[0]["t_last"] - recs[0]["t_first"]))


def test_epoch_runs_a_job_with_bench_runs_clock_written_first(server, tmp_path):
    job = tmp_path / "epochjob.py"
    job.write_text(f'''
import json, sys
from patchbay.measure import bench, prompts
plan = bench.Plan(url={server!r}, model="m", arms={{"A": {{}}, "B": {{}}}}, prompts=prompts.select(["prefill"])[:1],
                  levels=[1], reps=1, warmup=0, max_tokens=4, timeout=10)
rows = []
bench.run(plan, rows.extend)
open(sys.argv[1], "w").write(json.dumps(rows))
''')
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        before = time.perf_counter()
        assert client.main(["epoch", str(tmp_path / "epoch.txt"), "--module", "epochjob", "--",
                            str(tmp_path / "raw.json")]) == 0
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("epochjob", None)
    epoch = stalls.read_epoch((tmp_path / "epoch.txt").read_text())
    rows = json.loads((tmp_path / "raw.json").read_text())
    assert before <= epoch and {r["arm"] for r in rows} == {"A", "B"}
    assert all(0 <= r["t_start"] < r["t_first"] < time.perf_counter() - epoch for r in rows)
    assert bench.run.__name__ == "run"  # put back
    assert (tmp_path / "command.txt").read_text().startswith("python -m patchbay.measure.tools.client epoch ")
