"""The kernel build system on the CPU: every entry compiles for sm_90a with NVRTC from pip, the
compiler reports no spills, the cache is keyed on content, and the wheel ships cuda_src."""
import os
import subprocess
import sys
import zipfile

import pytest

from cupy_moe import _build
from cupy_moe.gpu import gemm

try:
    from cupy_moe import _nvrtc
    _nvrtc.version()
    NVRTC = None
except Exception as exc:  # pragma: no cover - the test extras install NVRTC
    NVRTC = str(exc)

needs_nvrtc = pytest.mark.skipif(NVRTC is not None, reason=f"NVRTC unavailable: {NVRTC}")

# Entry file -> the preludes it is built with (the GEMM once per representative config).
ENTRIES = {
    "gemm.cu": [gemm.prelude(c) for c in gemm.example_configs()],
    "gemm_sm90.cu": [gemm.sm90_prelude(c) for c in gemm.example_sm90_configs()],
    "gather_rows.cu": [""], "router.cu": [""], "routing.cu": [""], "swiglu.cu": [""], "combine.cu": [""], "sol080.cu": [""],
}


def test_every_entry_is_listed():
    assert sorted(ENTRIES) == _build.entry_files()


def kernel_bodies(source: str):
    """(name, body) of every __global__ function in a .cu source."""
    import re

    bounds = r"(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*|[A-Z][A-Z0-9_]*\s+)?"  # (or a macro of them)
    for m in re.finditer(r"__global__\s+void\s+" + bounds + r"(\w+)\s*\(", source):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[i], 0)
            i += 1
        start = source.index("{", i) + 1
        depth, j = 1, start
        while depth:
            depth += {"{": 1, "}": -1}.get(source[j], 0)
            j += 1
        yield m.group(1), source[start:j - 1]


# What a kernel may do before its wait: the Hopper GEMM's set-up, which touches only its own
# shared memory and parameters (its barriers and tensor-map prefetches: mainloop_wgmma.cuh set_up).
BEFORE_THE_WAIT = {"gemm_sm90_kernel": ["extern __shared__ __align__(1024) u8 smem[]",
                                        "if constexpr (Cfg::EARLY_SETUP) gemm::sm90::set_up<Cfg>(p, smem)"]}


def test_every_kernel_waits_for_prior_grids_first():
    """_launch launches every kernel as a programmatic dependent launch: a kernel that touched
    memory before wait_prior_grids() could read what the grid before it has not yet written."""
    import re

    kernels = {}
    for entry in _build.entry_files():
        for name, body in kernel_bodies((_build.cuda_src_dir() / entry).read_text()):
            code = re.sub(r"//[^\n]*", "", body)
            kernels[name] = [s.strip() for s in code.split(";")]
    assert len(kernels) >= 18 and "gemm_sm90_kernel" in kernels and "sol080_router" in kernels
    late = {name: stmts[:stmts.index("wait_prior_grids()")] if "wait_prior_grids()" in stmts else stmts[:1]
            for name, stmts in kernels.items()}
    late = {name: before for name, before in late.items() if before != BEFORE_THE_WAIT.get(name, [])}
    assert not late, f"kernels that do more than their set-up before wait_prior_grids(): {late}"


@needs_nvrtc
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_entry_compiles_for_sm90a_without_spills(entry, tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    for prelude in ENTRIES[entry]:
        path, log = _build.compile_entry(entry, prelude, "sm_90a", verbose=True)
        assert path.stat().st_size > 0
        assert "for 'sm_90a'" in log
        reports = [l for l in log.splitlines() if "spill stores" in l]
        assert reports, log
        for line in reports:
            assert "0 bytes spill stores, 0 bytes spill loads" in line, (entry, line)
        # ptxas serializes every wgmma of a kernel when it cannot keep their pipeline (a wgmma
        # under a runtime condition did it: bench/NOTES.md v0.22); that costs ~8%, so it fails here.
        assert "C7520" not in log and "serialized" not in log, (entry, prelude[-400:], log)
        # ... and a branch between two wgmmas makes it insert a warpgroup.arrive before each
        # (C7519; bench/NOTES.md v0.46): the MMAs of a k-step stay one straight run.
        assert "C7519" not in log, (entry, prelude[-400:], log)


@needs_nvrtc
def test_cache_is_content_keyed(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    p1, _ = _build.compile_entry("combine.cu", "", "sm_90a")
    mtime = p1.stat().st_mtime_ns
    p2, _ = _build.compile_entry("combine.cu", "", "sm_90a")
    assert p1 == p2 and p2.stat().st_mtime_ns == mtime  # second call: a cache hit
    p3, _ = _build.compile_entry("combine.cu", "// another prelude\n", "sm_90a")
    assert p3 != p1
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no partial files


@needs_nvrtc
def test_compile_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", "off")
    with pytest.raises(_nvrtc.NVRTCError, match="error"):
        _build.compile_entry("combine.cu", "this is not C++;", "sm_90a")


def test_render_cfg():
    text = _build.render_cfg(gemm.GemmConfig())
    assert "static constexpr int BM = 128;" in text and "static constexpr bool A_KMAJOR = true;" in text


@pytest.mark.slow
def test_wheel_contains_cuda_sources(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), root],
                   check=True)
    wheel = next(tmp_path.glob("cupy_moe-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    want = {f"cupy_moe/cuda_src/{e}" for e in ENTRIES}
    want |= {"cupy_moe/cuda_src/gemm/mainloop_mma.cuh", "cupy_moe/cuda_src/common/types.cuh",
             "cupy_moe/cuda_src/common/ptx.cuh"}
    assert want <= set(names), sorted(want - set(names))


@needs_nvrtc
def test_sm_trace_only_where_asked(tmp_path, monkeypatch):
    """TRACE_SCOPE() in every kernel is nothing unless the prelude defines CUPY_MOE_TRACE
    (load_module adds it for CUPY_MOE_TRACE=1, bench/sm_timeline.py): the library's cubins carry
    no trace buffer; the traced ones do."""
    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    plain, _ = _build.compile_entry("sol080.cu", "", "sm_90a")
    traced, _ = _build.compile_entry("sol080.cu", _build.TRACE_DEFINE, "sm_90a")
    assert b"cupy_moe_trace" not in plain.read_bytes()
    assert b"cupy_moe_trace" in traced.read_bytes()


@needs_nvrtc
def test_mbarrier_watchdog_only_where_asked(tmp_path, monkeypatch):
    """mbar_wait's watchdog (cuda_src/common/hopper.cuh) is compiled in only when the prelude
    defines CUPY_MOE_WATCHDOG (load_module adds it for CUPY_MOE_WATCHDOG=1): the library's GEMM
    cubins carry no record pointer; the watched ones do, and spill nothing for it."""
    from cupy_moe.gpu import gemm

    monkeypatch.setenv("CUPY_MOE_CACHE_DIR", str(tmp_path))
    prelude = gemm.sm90_prelude(gemm.Sm90Config(BN=128, STAGES=6, A_KMAJOR=False, B_KMAJOR=False, C_TMA=True,
                                                PINGPONG=True, STORE_RING=2, GROUPING=gemm.GROUPINGS["k"],
                                                DYNAMIC=True))
    plain, _ = _build.compile_entry("gemm_sm90.cu", prelude, "sm_90a")
    watched, log = _build.compile_entry("gemm_sm90.cu", _build.WATCHDOG_DEFINE + prelude, "sm_90a", verbose=True)
    assert b"cupy_moe_watchdog_out" not in plain.read_bytes()
    assert b"cupy_moe_watchdog_out" in watched.read_bytes()
    assert "0 bytes spill stores" in log
