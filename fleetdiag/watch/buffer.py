"""The per-host line buffer a watch keeps: what the analyzer needs of the latest run, bounded."""

from __future__ import annotations

from collections.abc import Iterable

from ..records import Line


class LineBuffer:
    """The latest run's lines the analyzer needs, merged by byte position, bounded.

    Two parts: the error-shaped lines with their context (and the snapshot),
    capped at ``cap`` lines by dropping the middle (the first lines hold the
    earliest, decisive error; the last ones the current state); and the last
    ``tail_cap`` routine lines, which only say where the log is now. A line
    seen twice (snapshot and follower, or a held-back partial line that later
    got its end) is kept once, the later text winning. A run-start line drops
    everything before it, as the funnel does.
    """

    def __init__(self, cap: int = 4000, tail_cap: int = 100):
        self.cap = max(10, cap)
        self._by_pos: dict[int, Line] = {}
        self._tail: dict[int, Line] = {}  # insertion order = arrival order
        self.tail_cap = max(1, tail_cap)
        self.dropped = 0
        self.dirty = False  # lines changed since the last analysis
        self.urgent = False  # ... and among them an error-shaped, context or run-start line (not only routine ones)

    def __len__(self) -> int:
        return len(self._by_pos) + len(self._tail)

    def reset(self, lines: Iterable[Line] = ()) -> None:
        self._by_pos = {}
        self._tail = {}
        self.dropped = 0
        for ln in lines:
            self._by_pos[ln.pos] = ln
        self.dirty = self.urgent = True
        self._trim()

    def add_tail(self, ln: Line) -> None:
        kept = self._by_pos.get(ln.pos)
        if kept is not None:  # already an important line: just take the newer text
            if kept.text != ln.text:
                self._by_pos[ln.pos] = Line(ln.pos, ln.text, ln.lineno if ln.lineno is not None else kept.lineno)
                self.dirty = self.urgent = True
            return
        if self._tail.get(ln.pos) == ln:
            return
        self._tail.pop(ln.pos, None)
        self._tail[ln.pos] = ln
        while len(self._tail) > self.tail_cap:
            del self._tail[next(iter(self._tail))]
        self.dirty = True

    def add(self, ln: Line, run_start: bool = False) -> None:
        if run_start:
            self._by_pos = {p: x for p, x in self._by_pos.items() if p >= ln.pos}
            self._tail = {p: x for p, x in self._tail.items() if p >= ln.pos}
            self.dropped = 0
        self._tail.pop(ln.pos, None)
        old = self._by_pos.get(ln.pos)
        if old is not None and old.text == ln.text:
            return
        if old is not None and ln.lineno is None:
            ln = Line(ln.pos, ln.text, old.lineno)
        self._by_pos[ln.pos] = ln
        self.dirty = self.urgent = True
        if len(self._by_pos) > self.cap:
            self._trim()

    def _trim(self) -> None:
        if len(self._by_pos) <= self.cap:
            return
        order = sorted(self._by_pos)
        head, tail = self.cap // 2, self.cap - self.cap // 2
        for p in order[head : len(order) - tail]:
            del self._by_pos[p]
            self.dropped += 1

    def lines(self) -> list[Line]:
        merged = {**self._tail, **self._by_pos}
        return [merged[p] for p in sorted(merged)]
