"""CUDA-graph replay of a public call's launches, for callers that repeat a call on the same
buffers (a training or benchmark loop: CuPy's pool hands the same addresses back).

A call is identified by everything its launches bake in: the device, the stream, the shapes and
the addresses of its inputs and outputs. The first time a key is seen the call runs eagerly; the
second time its launches are captured into a graph (cupy.cuda.Graph) together with a private
workspace for its temporaries, and from then on one graph launch replays them. A key seen once
costs nothing but its entry; at most CAPACITY graphs (and their workspaces) are kept, least
recently used dropped first. Set CUPY_MOE_GRAPHS=0 (or ENABLED = False) to always run eagerly.
"""
from __future__ import annotations

import os
from collections import OrderedDict

ENABLED = os.environ.get("CUPY_MOE_GRAPHS", "1") != "0"
CAPACITY = 4
_SEEN_CAPACITY = 64

_graphs: "OrderedDict[tuple, tuple]" = OrderedDict()  # key -> (graph, workspace)
_seen: "OrderedDict[tuple, None]" = OrderedDict()
_failed: set = set()
stats = {"eager": 0, "captured": 0, "replayed": 0}


def run(key: tuple, make_workspace, enqueue) -> None:
    """Run enqueue(workspace) on the current stream: eagerly, or captured, or replayed (see the
    module's doc). make_workspace() allocates the temporaries enqueue needs; enqueue must launch
    work only (no host syncs, no allocations that outlive it)."""
    import cupy

    from .. import _launch
    from . import gemm

    stream = cupy.cuda.get_current_stream()
    key = (cupy.cuda.Device().id, stream.ptr, _launch.PDL, gemm.DYNAMIC_TILES,
           tuple(sorted(gemm.CONFIG_OVERRIDE.items()))) + key
    entry = _graphs.get(key)
    if entry is not None:
        _graphs.move_to_end(key)
        entry[0].launch(stream)
        stats["replayed"] += 1
        return
    if ENABLED and key in _seen and key not in _failed:
        workspace = make_workspace()
        try:
            graph = _capture(enqueue, workspace)
        except Exception:  # capture refused: eager from now on (a real error shows there too)
            graph = None
        if graph is not None:
            if len(_graphs) >= CAPACITY:
                _graphs.popitem(last=False)
            _graphs[key] = (graph, workspace)
            graph.launch(stream)
            stats["captured"] += 1
            return
        _failed.add(key)
    _seen[key] = None
    _seen.move_to_end(key)
    if len(_seen) > _SEEN_CAPACITY:
        _seen.popitem(last=False)
    enqueue(make_workspace())
    stats["eager"] += 1


def _capture(enqueue, workspace):
    """The graph of enqueue(workspace)'s launches (captured on a side stream, not run)."""
    import cupy

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        side.begin_capture()
        try:
            enqueue(workspace)
        except Exception:
            try:
                side.end_capture()
            except Exception:
                pass
            raise
        graph = side.end_capture()
    return graph


def clear() -> None:
    """Drop every kept graph and workspace (and what was seen)."""
    _graphs.clear()
    _seen.clear()
    _failed.clear()
