"""The batching loop's zeroing of a cold 8K prompt's input rows ([7, 8,193] of a pinned
[7, 8,224] int32 tensor) on this host: torch's default intra-op threads against one, with the
pool idle for 0.2 s before each call as between requests. Prints one JSON line (us)."""
import json, os, time
import torch
t = torch.zeros((7, 8224), dtype=torch.int32).pin_memory()
out = {"cpus": os.cpu_count(), "default_threads": torch.get_num_threads()}
for n in (torch.get_num_threads(), 1):
    torch.set_num_threads(n)
    ts = []
    for _ in range(30):
        time.sleep(0.2)
        a = time.perf_counter(); t[:7, :8193].zero_(); ts.append((time.perf_counter() - a) * 1e6)
    ts.sort()
    out[f"threads_{n}"] = {"median_us": round(ts[15], 1), "max_us": round(ts[-1], 1), "min_us": round(ts[0], 1)}
print(json.dumps(out))
