# Scratch (not committed): FP8 W8A16 / W8A8 inner-loop variants at decode sizes, timed in CUDA graphs.
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cpu" if INTERP else "cuda"
DT = torch.float32 if INTERP else torch.bfloat16


@triton.jit
def k_gemm(x_ptr, w_ptr, s_ptr, part_ptr, rows_ptr, bexp_ptr, n_pairs, top_k, M, N, K, CHUNK, stride_xm, stride_wn,
           stride_we, stride_sn, stride_se, MODE: tl.constexpr, SWAP: tl.constexpr, GROUPED: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    chunk = tl.program_id(2)
    cols = pid_n * BN + tl.arange(0, BN)
    col_ok = cols < N
    w_base = w_ptr
    s_base = s_ptr
    if GROUPED:
        expert = tl.load(bexp_ptr + pid_m)
        pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
        row_ok = pairs < n_pairs
        xrows = tl.where(row_ok, pairs // top_k, 0).to(tl.int64)
        orows = tl.where(row_ok, pairs, 0).to(tl.int64)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        MM = n_pairs
    else:
        xrows = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
        row_ok = xrows < M
        orows = xrows
        MM = M
    k0 = chunk * CHUNK
    k1 = tl.minimum(k0 + CHUNK, K)
    sn = (cols // 128).to(tl.int64)
    if SWAP:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(k0, k1, BK):
        ks = k + tl.arange(0, BK)
        k_ok = ks < k1
        kb = k // 128
        if SWAP:
            w = tl.load(w_base + cols[:, None].to(tl.int64) * stride_wn + ks[None, :],
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_ptr + xrows[None, :] * stride_xm + ks[:, None], mask=row_ok[None, :] & k_ok[:, None],
                        other=0.0)
            if MODE == 0:
                acc = tl.dot(w, x, acc)
            else:
                s = tl.load(s_base + sn * stride_sn + kb)
                if MODE == 1:
                    acc = tl.dot((w.to(tl.float32) * s[:, None]).to(x.dtype), x, acc)
                elif MODE == 2:
                    acc += tl.dot(w.to(x.dtype), x) * s[:, None]
                else:
                    amax = tl.max(tl.abs(x.to(tl.float32)), axis=0)
                    sx = tl.maximum(amax, 1e-12) / 448.0
                    xq = (x.to(tl.float32) / sx[None, :]).to(tl.float8e4nv)
                    acc += tl.dot(w, xq) * (s[:, None] * sx[None, :])
        else:
            w = tl.load(w_base + cols[None, :].to(tl.int64) * stride_wn + ks[:, None],
                        mask=col_ok[None, :] & k_ok[:, None], other=0.0)
            x = tl.load(x_ptr + xrows[:, None] * stride_xm + ks[None, :], mask=row_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if MODE == 0:
                acc = tl.dot(x, w, acc)
            else:
                s = tl.load(s_base + sn * stride_sn + kb)
                if MODE == 1:
                    acc = tl.dot(x, (w.to(tl.float32) * s[None, :]).to(x.dtype), acc)
                elif MODE == 2:
                    acc += tl.dot(x, w.to(x.dtype)) * s[None, :]
                else:
                    amax = tl.max(tl.abs(x.to(tl.float32)), axis=1)
                    sx = tl.maximum(amax, 1e-12) / 448.0
                    xq = (x.to(tl.float32) / sx[:, None]).to(tl.float8e4nv)
                    acc += tl.dot(xq, w) * (sx[:, None] * s[None, :])
    if SWAP:
        tl.store(part_ptr + (chunk * MM + orows[None, :]) * N + cols[:, None], acc,
                 mask=row_ok[None, :] & col_ok[:, None])
    else:
        tl.store(part_ptr + (chunk * MM + orows[:, None]) * N + cols[None, :], acc,
                 mask=row_ok[:, None] & col_ok[None, :])


def quantize(w):
    n, k = w.shape[-2:]
    blocks = w.float().unflatten(-1, (k // 128, 128)).unflatten(-3, (n // 128, 128)) if False else None
    nb, kb = -(-n // 128), -(-k // 128)
    pad = torch.zeros(*w.shape[:-2], nb * 128, kb * 128, device=w.device)
    pad[..., :n, :k] = w.float()
    t = pad.unflatten(-1, (kb, 128)).unflatten(-3, (nb, 128))  # [.., nb, 128, kb, 128]
    amax = t.abs().amax(dim=(-3, -1)).clamp(min=1e-12)  # [.., nb, kb]
    s = amax / 448.0
    q = (t / s[..., :, None, :, None]).to(torch.float8_e4m3fn)
    q = q.flatten(-2).flatten(-3, -2)[..., :n, :k].contiguous()
    return q, s.contiguous()


def run(x, w, s, mode, swap, bm, bn, bk, chunks, warps, stages, grouped=None, out=None):
    K = x.shape[1]
    N = w.shape[-2]
    chunk = -(-K // chunks)
    chunk = -(-chunk // 128) * 128
    chunks = -(-K // chunk)
    if grouped is None:
        M = x.shape[0]
        MM = M
        grid = (-(-N // bn), -(-M // bm), chunks)
        rows = bexp = x
        n_pairs, top_k = 0, 1
    else:
        rows, bexp, n_pairs, top_k = grouped
        M = MM = n_pairs
        grid = (-(-N // bn), bexp.shape[0], chunks)
    if out is None:
        out = torch.empty(chunks, MM, N, device=x.device, dtype=torch.float32)
    ws = w.stride(-2)
    we = w.stride(0) if w.dim() == 3 else 0
    se = s.stride(0) if s.dim() == 3 else 0
    k_gemm[grid](x, w, s, out, rows, bexp, n_pairs, top_k, M, N, K, chunk, x.stride(0), ws, we, s.stride(-2), se,
                 MODE=mode, SWAP=swap, GROUPED=grouped is not None, BM=bm, BN=bn, BK=bk, num_warps=warps,
                 num_stages=stages)
    return out


def timeit(fn, iters=20, reps=5):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    g.replay()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3 / iters)
    return best


DENSE = {"q_proj": (12288, 4096), "k_proj": (1024, 4096), "o_proj": (4096, 12288), "shared gate_up": (2816, 4096),
         "shared down": (4096, 1408), "dense gate_up": (21888, 4096), "dense down": (4096, 10944)}


def configs(m, quick):
    bm = 16 if m <= 16 else 32 if m <= 32 else 64
    out = []
    for swap in (0, 1):
        for bn in ((64, 128) if swap else (32, 64)):
            for bk in (64, 128):
                for stages in ((3, 4) if not quick else (4,)):
                    out.append(dict(swap=swap, bm=bm, bn=bn, bk=bk, warps=4, stages=stages))
    return out


def main():
    quick = True
    torch.manual_seed(0)
    results = []
    bw = 4.8e12
    names = ["k_proj", "shared down"] if INTERP else list(DENSE)
    tokens = [1, 3] if INTERP else [1, 8, 32]
    modes = [0, 1, 2, 3]
    for name in names:
        n, k = DENSE[name]
        if INTERP:
            n, k = 256, 384
        w = torch.randn(n, k, device=DEV) * 0.02
        q, s = quantize(w)
        twin = (q.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]).to(DT)
        copies = 1 if INTERP else max(1, int(4e8 // (n * k)))
        qs = [q.clone() for _ in range(copies)]
        ts = [twin.clone() for _ in range(copies)]
        for m in tokens:
            x = (torch.randn(m, k, device=DEV)).to(DT)
            ref = x.float() @ twin.float().t()
            for chunks in ((1, 2, 4) if not INTERP else (1, 2)):
                if k // chunks < 512 and chunks > 1 and not INTERP:
                    continue
                for cfg in configs(m, quick):
                    for mode in modes:
                        if mode == 3 and cfg["bk"] != 128:
                            continue
                        ws = ts if mode == 0 else qs
                        try:
                            out = run(x, ws[0], s, mode, chunks=chunks, **cfg).sum(0)
                            err = ((out - ref).abs().max() / ref.abs().max()).item()
                            if INTERP:
                                us = 0.0
                            else:
                                i = [0]

                                def fn():
                                    i[0] = (i[0] + 1) % copies
                                    run(x, ws[i[0]], s, mode, chunks=chunks, **cfg)

                                us = timeit(fn) * 1e6
                            nbytes = n * k * (2 if mode == 0 else 1)
                            results.append(dict(name=name, m=m, mode=mode, chunks=chunks, us=us, err=err,
                                                roof=nbytes / bw / (us * 1e-6) if us else 0, **cfg))
                        except Exception as e:  # noqa
                            results.append(dict(name=name, m=m, mode=mode, chunks=chunks, error=repr(e)[:300],
                                                **cfg))
        print(name, "done", time.strftime("%X"), flush=True)
        json.dump(dict(dense=results), open(os.path.join(os.environ.get("OUT", "/tmp"), "partial.json"), "w"))
    # bits: a row alone vs among 64 / 256 rows, same chunks, tiles by row count
    bits = []
    n, k = (256, 384) if INTERP else DENSE["q_proj"]
    w = torch.randn(n, k, device=DEV) * 0.02
    q, s = quantize(w)
    big = torch.randn(256, k, device=DEV).to(DT)
    for mode in (1, 2, 3):
        for swap in (0, 1):
            for bk in (64, 128):
                if mode == 3 and bk != 128:
                    continue
                bn = 128 if swap else 64
                alone = run(big[:1], q, s, mode, swap, 16, bn, bk, 1, 4, 3)[0, 0]
                same = {}
                for rows, bm in ((8, 16), (32, 32), (64, 64), (256, 64), (256, 128)):
                    if INTERP and bm > 32:
                        continue
                    other = run(big[:rows], q, s, mode, swap, bm, bn, bk, 1, 4 if bm < 128 else 8, 3)[0, 0]
                    same[f"{rows}r/bm{bm}"] = bool(torch.equal(alone, other))
                bits.append(dict(mode=mode, swap=swap, bk=bk, bn=bn, same=same))
    # grouped (experts): top-8 of 128, gate_up [128, 2816, 4096], down [128, 4096, 1408]
    grouped = []
    E, H, I = (8, 256, 256) if INTERP else (128, 4096, 1408)
    for label, (n, k) in (("experts gate_up", (2 * I, H)), ("experts down", (H, I))):
        w = torch.randn(E, n, k, device=DEV) * 0.02
        q, s = quantize(w)
        twin = (q.float() * s.repeat_interleave(128, -2)[:, :n].repeat_interleave(128, -1)[..., :k]).to(DT)
        del w
        for m in ([1, 2] if INTERP else [1, 8, 32]):
            topk = 2 if INTERP else 8
            idx = torch.stack([torch.randperm(E, device=DEV)[:topk] for _ in range(m)]).flatten()
            x = torch.randn(m * (1 if label.endswith("gate_up") else topk), k, device=DEV).to(DT)
            if label.endswith("down"):
                pass
            # rows sorted by expert, padded to BM
            for cfg in configs(m * topk, True):
                bm = 16 if m * topk <= 64 else cfg["bm"]
                order = torch.argsort(idx, stable=True)
                blocks, bexp = [], []
                for e in torch.unique(idx):
                    sel = order[idx[order] == e]
                    for j in range(0, len(sel), bm):
                        part = sel[j:j + bm]
                        blocks.append(torch.cat([part, torch.full((bm - len(part),), m * topk, device=DEV)]))
                        bexp.append(int(e))
                rows = torch.cat(blocks).to(torch.int32)
                be = torch.tensor(bexp, device=DEV, dtype=torch.int32)
                tk = topk if label.endswith("gate_up") else 1
                cfg = dict(cfg, bm=bm)
                for mode in (0, 1, 2, 3):
                    if mode == 3 and cfg["bk"] != 128:
                        continue
                    ws = twin if mode == 0 else q
                    try:
                        args = (x, ws, s, mode)
                        kw = dict(chunks=1, grouped=(rows, be, m * topk, tk), **cfg)
                        out = run(*args, **kw)[0]
                        xr = x[(rows.long().clamp(max=m * topk - 1) // tk)]
                        ok = rows.long() < m * topk
                        ref = torch.einsum('rk,rnk->rn', xr.float(), twin[be.long().repeat_interleave(bm)].float())
                        got = out[rows.long().clamp(max=m * topk - 1)]
                        err = ((got - ref)[ok].abs().max() / ref[ok].abs().max()).item()
                        us = 0.0 if INTERP else timeit(lambda: run(*args, **kw)) * 1e6
                        nbytes = len(torch.unique(idx)) * n * k * (2 if mode == 0 else 1)
                        grouped.append(dict(name=label, m=m, mode=mode, us=us, err=err, roof=nbytes / bw / (us * 1e-6) if us else 0,
                                            **cfg))
                    except Exception as e:  # noqa
                        grouped.append(dict(name=label, m=m, mode=mode, error=repr(e)[:300], **cfg))
        print(label, "done", time.strftime("%X"), flush=True)
    json.dump(dict(dense=results, bits=bits, grouped=grouped,
                   device=torch.cuda.get_device_name() if not INTERP else "cpu"),
              open(os.path.join(os.environ.get("OUT", "/tmp"), "fp8bench.json"), "w"), indent=1)
    summarize(results, bits, grouped)


def summarize(results, bits, grouped):
    import collections
    best = collections.defaultdict(dict)
    for r in results + grouped:
        if "error" in r:
            continue
        key = (r["name"], r["m"])
        tag = ("bf16", "expand", "after", "w8a8")[r["mode"]] + ("/swap" if r["swap"] else "")
        if tag not in best[key] or r["us"] < best[key][tag]["us"]:
            best[key][tag] = r
    for key, d in best.items():
        print(key, " | ".join(f"{t} {r['us']:.1f}us {r['roof']:.2f} (bn{r['bn']} bk{r['bk']} st{r['stages']} "
                                 f"c{r.get('chunks', 1)})" for t, r in sorted(d.items())))
    errs = [r for r in results + grouped if "error" in r]
    print("errors", len(errs), errs[:3])
    for b in bits:
        print("bits", b)


if __name__ == "__main__":
    main()
