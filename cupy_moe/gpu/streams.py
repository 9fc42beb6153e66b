"""A caller's stream's side stream, and named events that order the two: what a call that runs
launches side by side (gpu/side_by_side.py, gpu/sol080.py) forks onto and joins back from. Made
once per (device, caller's stream, event names) and kept, so repeated calls on one stream make no
new streams or events."""
from __future__ import annotations

import cupy as cp

_sides = {}  # (device, caller's stream, names) -> Side


class Side:
    """side.stream, and one event per name as an attribute (side.fork, side.join, ...)."""

    def __init__(self, names):
        self.stream = cp.cuda.Stream(non_blocking=True)
        for name in names:
            setattr(self, name, cp.cuda.Event(disable_timing=True))

    @classmethod
    def of(cls, main, names: tuple) -> "Side":
        key = (cp.cuda.Device().id, main.ptr, names)
        side = _sides.get(key)
        if side is None:
            if len(_sides) >= 16:
                _sides.clear()
            side = _sides[key] = cls(names)
        return side
