"""The n-gram lookup behind PB_DRAFT_TOKENS, stdlib only: the engine drafts with it, and
`patchbay drafts` (src/patchbay/measure/draft.py) walks the same class along serial replies to
measure what the engine would keep."""


class Lookup:
    """A growing token list and, for every n from `shortest` to `longest`, where each n-gram last
    ended: `propose(k)` gives up to k tokens that followed the latest earlier occurrence of the
    list's last n tokens, the longest n that occurred first; [] where none did."""

    def __init__(self, ids=(), longest: int = 4, shortest: int = 2):
        if not 1 <= shortest <= longest:
            raise ValueError(f"n-grams from {shortest} to {longest}: need 1 <= shortest <= longest")
        self.longest, self.shortest = longest, shortest
        self.ids: list[int] = []
        self._ends: dict[int, dict[tuple, int]] = {n: {} for n in range(shortest, longest + 1)}
        self.extend(ids)

    def extend(self, tokens) -> None:
        ids = self.ids
        start = len(ids)
        ids.extend(int(token) for token in tokens)
        # Each new token at index `end` files the n-grams that end just before it (ids[end - n:end]
        # -> end), so the list's own last n-gram is never its own match; later ends overwrite
        # earlier ones. Built with zip in one pass per n (a 32K-token prompt in a few ms, where a
        # loop over tokens took tens).
        for n in range(self.shortest, self.longest + 1):
            lo = max(start, n)
            if lo < len(ids):
                grams = zip(*(ids[lo - n + k:len(ids) - n + k] for k in range(n)))
                self._ends[n].update(zip(grams, range(lo, len(ids))))

    def propose(self, k: int) -> list[int]:
        return self.match(k)[1]

    def match(self, k: int) -> tuple[int, list[int]]:
        """(where the proposed tokens start in the list, the tokens); (-1, []) where nothing matched."""
        ids = self.ids
        for n in range(min(self.longest, len(ids)), self.shortest - 1, -1):
            end = self._ends[n].get(tuple(ids[len(ids) - n:]))
            if end is not None:
                return end, ids[end:end + k]
        return -1, []
