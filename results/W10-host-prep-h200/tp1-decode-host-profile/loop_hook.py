"""Per-step host profile of the batching loop (only when HOSTPROF2_DIR is set): the wall time of
every loop body, then cProfile over bodies FROM..TO, written per process to HOSTPROF2_DIR."""
import os
OUT = os.environ.get("HOSTPROF2_DIR")
if OUT:
    import cProfile, importlib.abc, importlib.util, pstats, sys, time
    FROM, TO = int(os.environ.get("HOSTPROF2_FROM", "300")), int(os.environ.get("HOSTPROF2_TO", "900"))
    MOD = "transformers.generation.continuous_batching.continuous_api"

    def patch(mod):
        cls = mod.ContinuousBatchingManager
        body = cls._generation_loop_body
        state = {"n": 0, "prof": cProfile.Profile(), "walls": [], "starts": []}

        def wrapped(self, *a, **k):
            n = state["n"]; state["n"] += 1
            t0 = time.perf_counter()
            if FROM <= n < TO:
                state["prof"].enable()
                try:
                    return body(self, *a, **k)
                finally:
                    state["prof"].disable()
            try:
                return body(self, *a, **k)
            finally:
                if n < FROM:
                    state["walls"].append(time.perf_counter() - t0); state["starts"].append(t0)
                if n == TO:
                    tag = f"{os.getpid()}"
                    os.makedirs(OUT, exist_ok=True)
                    state["prof"].dump_stats(f"{OUT}/loop-{tag}.prof")
                    with open(f"{OUT}/walls-{tag}.txt", "w") as f:
                        for s, w in zip(state["starts"], state["walls"]):
                            f.write(f"{s:.6f} {w * 1000:.4f}\n")
        cls._generation_loop_body = wrapped

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != MOD: return None
            sys.meta_path.remove(self)
            try:
                spec = importlib.util.find_spec(name)
            finally:
                sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None: return None
            orig = spec.loader.exec_module
            def exec_module(module, orig=orig):
                orig(module); patch(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Finder())
