"""PB_SWITCH_INTERVAL: how long a Python thread may hold the interpreter lock while another
waits for it.

The server runs the batching loop in one thread and the HTTP handlers (tokenizing, parsing,
one streamed event per token per request) on the event loop in another. Python lets a
thread that wants the lock wait up to the switch interval (5 ms by default) before the
holder must give it up, and a decode step on an H200 takes about that long: the batching
loop can lose a step's worth of time on each hand-over while dozens of streams are being
written. The knob sets the interval, in microseconds, when the server starts.
"""

import sys

from .. import knobs


def apply() -> None:
    microseconds = knobs.get("PB_SWITCH_INTERVAL")
    if microseconds:
        sys.setswitchinterval(microseconds / 1e6)
