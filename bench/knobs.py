"""The A/B scripts' knobs (ab_sol080_plans.py, ab_layer.py): a variant is a comma list of
key=value, and every knob it does not name takes the value its module held when the script
started, so "base" is always the library's own setting (environment overrides included) and a
changed library default needs no edit here. cfg.FIELD=N overrides that Sm90Config field on every
Hopper GEMM (gemm.CONFIG_OVERRIDE)."""
from __future__ import annotations

from typing import Callable, NamedTuple


class Knob(NamedTuple):
    module: object
    attr: str
    parse: Callable[[str, object], object]  # (the variant's value, the start-up value) -> the module's value


def integer(value: str, _default) -> int:
    return int(value)


def flag(value: str, _default) -> bool:
    return value != "0"


def text(value: str, _default) -> str:
    return value


class Knobs:
    def __init__(self, table: dict[str, Knob]):
        from cupy_moe.gpu import gemm

        self._gemm = gemm
        self._table = table
        self._defaults = {key: getattr(k.module, k.attr) for key, k in table.items()}
        self._config = dict(gemm.CONFIG_OVERRIDE)

    def use(self, variant: str) -> None:
        given = dict(kv.split("=", 1) for kv in variant.split(",") if kv != "base")
        config = {key[4:]: int(given.pop(key)) for key in list(given) if key.startswith("cfg.")}
        unknown = sorted(set(given) - set(self._table))
        if unknown:
            raise SystemExit(f"variant {variant!r}: unknown knobs {unknown}; known: {sorted(self._table)}")
        for key, k in self._table.items():
            default = self._defaults[key]
            setattr(k.module, k.attr, k.parse(given[key], default) if key in given else default)
        self._gemm.CONFIG_OVERRIDE = {**self._config, **config}
