import os
import pstats
import sys
import types

from patchbay.measure.tools import loop_hook


def test_the_first_bodies_are_timed_then_a_range_is_profiled(tmp_path):
    module = types.ModuleType("fake_continuous_api")

    def squares(n):
        return sum(i * i for i in range(n))

    class Manager:  # the batching loop's shape: one body call a step
        def __init__(self):
            self.steps = 0

        def body(self):
            self.steps += 1
            return squares(1000 * self.steps)

    module.Manager, module.squares = Manager, squares
    sys.modules[module.__name__] = module
    try:
        loop_hook.install(str(tmp_path), first=3, last=5, module=module.__name__, body="Manager.body")
        manager = Manager()
        results = [manager.body() for _ in range(7)]
    finally:
        del sys.modules[module.__name__]
    assert results == [squares(1000 * n) for n in range(1, 8)]  # the bodies still do their work
    walls = (tmp_path / f"walls-{os.getpid()}.txt").read_text().splitlines()
    assert len(walls) == 3  # bodies 0-2
    starts = [float(line.split()[0]) for line in walls]
    assert starts == sorted(starts) and all(float(line.split()[1]) >= 0 for line in walls)
    stats = pstats.Stats(str(tmp_path / f"loop-{os.getpid()}.prof"))
    calls = {fn[2]: stat[1] for fn, stat in stats.stats.items()}
    assert calls["squares"] == 2  # bodies 3 and 4 ran under the profiler
