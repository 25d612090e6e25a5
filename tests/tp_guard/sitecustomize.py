"""On the path of a tensor-parallel rank that tests/test_tp.py watches for unpickling.

Every way into the unpickler (pickle.loads, pickle.load, pickle.Unpickler and so torch's
`distributed_c10d._unpickler`, bound from it when torch is imported later) is wrapped before
anything else is imported. Each call appends one line to $TP_GUARD_LOG: the thread and the
innermost frames outside this file. Nothing is refused: the engine runs as it would, and the
test reads the log.
"""

import os
import pickle
import threading
import traceback

_LOG = os.environ.get("TP_GUARD_LOG")


def _record(what: str) -> None:
    frames = [f for f in traceback.extract_stack()[:-2] if f.filename != __file__][-6:]
    where = " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))
    with open(_LOG, "a") as log:
        log.write(f"rank {os.environ.get('RANK', '-')}: {what} [{threading.current_thread().name}] {where}\n")


if _LOG:
    _loads, _load, _Unpickler = pickle.loads, pickle.load, pickle.Unpickler

    def loads(*args, **kwargs):
        _record("pickle.loads")
        return _loads(*args, **kwargs)

    def load(*args, **kwargs):
        _record("pickle.load")
        return _load(*args, **kwargs)

    class Unpickler(_Unpickler):
        def load(self):
            _record("pickle.Unpickler.load")
            return super().load()

    pickle.loads, pickle.load, pickle.Unpickler = loads, load, Unpickler
