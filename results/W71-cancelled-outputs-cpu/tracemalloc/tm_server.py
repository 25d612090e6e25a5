"""Start the local set on synthetic:trained with tracemalloc snapshots (devjob/tmsite), print url and pid."""
import dataclasses, os, sys
from pathlib import Path
from patchbay.runtime import config, launch
from patchbay.runtime.models import model_path
from patchbay.series import build, series

@dataclasses.dataclass
class TMEngine:
    engine: object
    @property
    def build_id(self): return self.engine.build_id
    @property
    def site(self): return self.engine.site
    def env(self):
        e = dict(self.engine.env())
        e["PYTHONPATH"] = os.pathsep.join(["/work/main/devjob/tmsite", e.get("PYTHONPATH", "")])
        e["TM_DIR"] = sys.argv[2]; e["TM_EVERY"] = sys.argv[3]
        return e
    def __getattr__(self, k): return getattr(self.engine, k)

LOCAL = config.load(config.CONFIG_DIR / "local.env.example", environ={})
cfg = dataclasses.replace(LOCAL, port=8124, run_dir=sys.argv[1], model="synthetic:trained")
eng = build.build(series.load()[0], progress=lambda *_: None)
files = launch.RunFiles(Path(sys.argv[1]))
info = launch.start(cfg, TMEngine(eng), model_path(cfg), files, progress=lambda *_: None)
print(info)
