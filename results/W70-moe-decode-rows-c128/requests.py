"""The API passes of rows_ab.py read back from the servers' request log lines (0580's pb-request):
`ab`'s own windows did not come back from the device. Chat requests in the order they finished,
taken 128 at a time (a pass; the first holds the readiness probes). argv: server logs (.log.gz)"""
import gzip, json, statistics as st, sys

for path in sys.argv[1:]:
    rows = []
    for line in gzip.open(path, "rt"):
        if "pb-request {" in line:
            d = json.loads(line.split("pb-request ", 1)[1])
            if d["route"].startswith("/v1/chat") and d["completion_tokens"]:
                rows.append(d)
    if len(rows) < 128:
        print(path, len(rows), "chat requests: no whole pass")
        continue
    dec = [(d["completion_tokens"] - 1) / (d["duration_s"] - d["ttft_s"]) for d in rows]
    ttft = sorted(d["ttft_s"] for d in rows)
    print(f"{path}: {len(rows)} chat requests, {sum(d['status'] != 200 for d in rows)} failed; decode tok/s per "
          f"stream median {st.median(dec):.1f}; first token median {st.median(ttft):.3f} s, p95 "
          f"{ttft[int(0.95 * len(ttft))]:.3f} s; request duration median {st.median(d['duration_s'] for d in rows):.2f} s")
    for i in range(0, len(rows), 128):
        g = rows[i:i + 128]
        print(f"  pass {i // 128}: decode median {st.median(dec[i:i + 128]):.1f} tok/s, first token median "
              f"{st.median(d['ttft_s'] for d in g):.3f} s, longest request {max(d['duration_s'] for d in g):.2f} s")
