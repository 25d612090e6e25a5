"""Diagnostic hook (sitecustomize): logs, on the monotonic clock, every Triton compile (or
cache load), every CUDA-graph capture and every "Request received" log line, one TSV per process
in $STALLPROF_DIR. Used to find what stalls a pass's first tokens for 1.5-2.4 s."""
import os, sys, time, threading

D = os.environ.get("STALLPROF_DIR")
if D:
    os.makedirs(D, exist_ok=True)
    _f = open(os.path.join(D, f"ev-{os.getpid()}-r{os.environ.get('RANK', os.environ.get('PB_RANK', 'x'))}.tsv"), "a", buffering=1)
    _lock = threading.Lock()

    def emit(kind, name, t0, t1):
        with _lock:
            _f.write(f"{t0:.6f}\t{t1 - t0:.6f}\t{kind}\t{name}\n")

    emit("start", " ".join(sys.argv)[:200], time.perf_counter(), time.perf_counter())

    import logging
    _old = logging.getLogRecordFactory()

    def factory(*a, **k):
        r = _old(*a, **k)
        try:
            msg = str(r.msg)
            if "Request received" in msg or "apture" in msg or "warmup" in msg.lower():
                t = time.perf_counter()
                emit("log", msg[:120].replace("\t", " "), t, t)
        except Exception:
            pass
        return r

    logging.setLogRecordFactory(factory)

    def _patch_triton():
        try:
            from triton.runtime import jit
        except Exception:
            return
        J = jit.JITFunction
        if hasattr(J, "_do_compile") and not getattr(J._do_compile, "_pb", False):
            orig = J._do_compile

            def _do_compile(self, key, *a, **k):
                t0 = time.perf_counter()
                try:
                    return orig(self, key, *a, **k)
                finally:
                    emit("triton", f"{getattr(self, '__name__', '?')} {str(key)[:160]}", t0, time.perf_counter())
            _do_compile._pb = True
            J._do_compile = _do_compile

    def _patch_graphs():
        try:
            import torch
        except Exception:
            return
        G = torch.cuda.CUDAGraph
        if getattr(G.capture_begin, "_pb", False):
            return
        state = {}
        ob, oe = G.capture_begin, G.capture_end

        def capture_begin(self, *a, **k):
            state[id(self)] = time.perf_counter()
            return ob(self, *a, **k)

        def capture_end(self, *a, **k):
            r = oe(self, *a, **k)
            t0 = state.pop(id(self), time.perf_counter())
            emit("graph", "capture", t0, time.perf_counter())
            return r
        capture_begin._pb = capture_end._pb = True
        G.capture_begin, G.capture_end = capture_begin, capture_end

    def _poll():
        done = set()
        while len(done) < 2:
            time.sleep(0.2)
            try:
                jm = sys.modules.get("triton.runtime.jit")
                if "t" not in done and jm is not None and hasattr(jm, "JITFunction"):
                    _patch_triton(); done.add("t")
                tm = sys.modules.get("torch")
                if "g" not in done and tm is not None and hasattr(tm, "cuda") and hasattr(tm.cuda, "CUDAGraph"):
                    _patch_graphs(); done.add("g")
            except Exception as e:  # a diagnostic must not take the server down
                emit("hookerror", repr(e)[:150], time.perf_counter(), time.perf_counter())

    threading.Thread(target=_poll, daemon=True, name="stallprof").start()
