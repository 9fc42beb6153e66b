"""Run-time settings of the GPU modules, and when they last changed.

gpu/sol080.py, gpu/gemm.py and gpu/router.py read their settings (kernel choices, plan rules,
A/B switches) from module globals, set from the environment at import and by tests and the
bench/ A/B scripts at run time (monkeypatch.setattr, bench/knobs.py). `watch` makes every
assignment to such a module's attributes bump `epoch()`, so that what is derived from the settings
may be kept until the next change: SOL-080's plan (gpu/sol080.py _Plan.of), ~20 us of host time a
call otherwise (bench/NOTES.md v0.38). Assignments by the modules' own functions (a `global`
statement) would not count; none of the three makes one."""
from __future__ import annotations

import sys
import types

_epoch = 0


def epoch() -> int:
    """How many assignments the watched modules' attributes have had."""
    return _epoch


def _bump() -> None:
    global _epoch
    _epoch += 1


class _Watched(types.ModuleType):
    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        _bump()

    def __delattr__(self, name):
        super().__delattr__(name)
        _bump()


def watch(module_name: str) -> None:
    """Count every later assignment to the attributes of the module of that name."""
    sys.modules[module_name].__class__ = _Watched
