import os
if os.environ.get("TM_DIR"):
    import threading, time, tracemalloc, gc
    tracemalloc.start(12)
    d = os.environ["TM_DIR"]; os.makedirs(d, exist_ok=True)
    def dump():
        n = 0
        while True:
            time.sleep(float(os.environ.get("TM_EVERY", "60")))
            gc.collect()
            tracemalloc.take_snapshot().dump(f"{d}/snap-{os.getpid()}-{n:03d}.tm")
            n += 1
    threading.Thread(target=dump, daemon=True).start()
if os.environ.get("TM_DIR"):
    import signal, gc, sys, types
    def _refs(*_):
        def run():
            gc.collect()
            out = open(f"{os.environ['TM_DIR']}/refs-{os.getpid()}.txt", "w")
            objs = [o for o in gc.get_objects() if type(o).__name__ in ("RequestState", "GenerationOutput")]
            out.write(f"{len(objs)} objects: " + str({n: sum(type(o).__name__ == n for o in objs) for n in ("RequestState", "GenerationOutput")}) + "\n")
            seen_mods = {id(m): name for name, m in list(sys.modules.items())}
            for o in objs[:6]:
                out.write(f"\n== {type(o).__name__} {getattr(o, 'request_id', '')} status={getattr(o, 'status', '')}\n")
                frontier = [(o, "")]
                for depth in range(5):
                    nxt = []
                    for obj, path in frontier:
                        for r in gc.get_referrers(obj):
                            if r is frontier or r is objs or isinstance(r, types.FrameType) or r is nxt:
                                continue
                            desc = type(r).__name__
                            if isinstance(r, dict):
                                keys = [k for k, v in r.items() if v is obj][:2]
                                mod = seen_mods.get(id(r))
                                desc += f"[{keys}]" + (f" globals of {r.get('__name__')}" if "__name__" in r and "__builtins__" in r else "")
                            out.write(f"{'  ' * depth}{desc}\n")
                            if len(nxt) < 6:
                                nxt.append((r, path))
                    frontier = nxt
            out.close()
        threading.Thread(target=run, daemon=True).start()
    signal.signal(signal.SIGUSR1, _refs)
