"""Static instruction counts (a cubin's .text size / 16) and ptxas' register report of the example
Hopper GEMM configs, the E_STAGED ones by default (--all: every config). A CPU-only first look at
an epilogue trim: -256 and -160 instructions of the routed E_STAGED config measured -0.7% and
-0.5% on the layer's fused SwiGLU dgrad (bench/NOTES.md v0.25). Not a proxy for the k-loop.
Usage: PYTHONPATH=. python tools/text_size.py [--all]"""
import os
import sys
import tempfile

os.environ["CUPY_MOE_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(__file__))

from cubin_code_hash import code_sections  # noqa: E402
from cupy_moe import _build  # noqa: E402
from cupy_moe.gpu import gemm  # noqa: E402


def main():
    every = "--all" in sys.argv
    for i, cfg in enumerate(gemm.example_sm90_configs()):
        if not (every or cfg.E_STAGED):
            continue
        path, log = _build.compile_entry("gemm_sm90.cu", gemm.sm90_prelude(cfg), "sm_90a", verbose=True)
        text = sum(len(data) for name, data in code_sections(path.read_bytes()).items() if name.startswith(".text"))
        regs = [line.split(":", 1)[1].strip() for line in log.splitlines() if "registers" in line]
        print(i, f"BN={cfg.BN} grouping={cfg.GROUPING} epilogue={cfg.EPILOGUE}", f"{text // 16} instructions",
              *regs[:1], flush=True)


if __name__ == "__main__":
    main()
