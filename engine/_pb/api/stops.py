"""Stop strings on decoded text, for chat replies and legacy completions alike.

Text arrives a token's piece at a time; a stop string may begin in one piece and end in a
later one, so the tail that could still be the start of one is held back. The reply ends at
the earliest stop string found; vLLM's `include_stop_str_in_output` keeps that string in the
text, otherwise the text ends just before it.
"""


class StopCutter:
    def __init__(self, stops, keep_stop: bool = False):
        self.stops, self.keep_stop = tuple(stops), keep_stop
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.held = ""  # decoded text not released yet (a stop string may start in it)
        self.stopped = False

    def feed(self, piece: str) -> str:
        """Decoded text in; the text it releases out (all of what is left once a stop string ended it)."""
        self.held += piece
        found = [(at, stop) for stop in self.stops if (at := self.held.find(stop)) != -1]
        if found:
            at, stop = min(found, key=lambda f: (f[0], -len(f[1])))
            self.held, self.stopped = self.held[:at + (len(stop) if self.keep_stop else 0)], True
        cut = len(self.held) if self.stopped else max(len(self.held) - self.hold, 0)
        ready, self.held = self.held[:cut], self.held[cut:]
        return ready

    def flush(self) -> str:
        """At the end of the reply: whatever is still held."""
        rest, self.held = self.held, ""
        return rest
