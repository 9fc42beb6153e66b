"""One hash of the machine code of every example Hopper GEMM config (the cubins' .text, .nv.info,
.nv.constant and .nv.shared sections; not symbol names, which change when a constexpr is renamed).
Compare it before and after a kernel edit meant to change nothing (a CPU-only check: equal hashes
mean the device-verified code is what runs).
With --per-config: a line per config instead (its index, the hash of its instructions, its tile
width and grouping, whether it stages the SwiGLU epilogue, its static instruction count, and ptxas'
spills or C7520 "wgmma serialized" advisory where it reports them), to see which configs an edit
changed and what it cost. The instruction count is a CPU-side first look at an epilogue trim (-256
and -160 instructions of the routed E_STAGED config measured -0.7% and -0.5% on the layer's fused
SwiGLU dgrad, bench/NOTES.md v0.25); not a proxy for the k-loop.
Usage: PYTHONPATH=. python tools/cubin_code_hash.py [--first N] [--per-config] (--first: only the
first N configs, those an older revision had, when configs were appended since)"""
import hashlib
import os
import struct
import sys
import tempfile

os.environ["CUPY_MOE_CACHE_DIR"] = tempfile.mkdtemp()

from cupy_moe import _build  # noqa: E402
from cupy_moe.gpu import gemm  # noqa: E402

KEPT = (".text", ".nv.constant", ".nv.info", ".nv.shared")


def code_sections(elf: bytes) -> dict:
    """ELF64 section name -> bytes (size for NOBITS sections), for the sections in KEPT."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    names = headers[names_index][4]
    out = {}
    for name_at, kind, _, _, offset, size, *_ in headers:
        name = elf[names + name_at: elf.index(b"\0", names + name_at)].decode()
        if name.startswith(KEPT):
            out[name] = str(size).encode() if kind == 8 else elf[offset: offset + size]
    return out


def main():
    digest, text = hashlib.sha256(), hashlib.sha256()
    configs = gemm.example_sm90_configs()
    if "--first" in sys.argv:
        configs = configs[:int(sys.argv[sys.argv.index("--first") + 1])]
    per_config = "--per-config" in sys.argv
    for i, cfg in enumerate(configs):
        path, log = _build.compile_entry("gemm_sm90.cu", gemm.sm90_prelude(cfg), "sm_90a", verbose=per_config)
        mine, instructions = hashlib.sha256(), 0
        for name, data in sorted(code_sections(path.read_bytes()).items()):
            digest.update(name.encode() + data)
            if name.startswith(".text"):
                text.update(name.encode() + data)
                mine.update(name.encode() + data)
                instructions += len(data) // 16
        if per_config:
            flags = [line.strip() for line in log.splitlines()
                     if "C7520" in line or ("spill" in line and " 0 bytes spill stores" not in line)]
            print(i, mine.hexdigest()[:12], f"BN={cfg.BN} grouping={cfg.GROUPING}",
                  f"e_staged={int(cfg.E_STAGED)} {instructions} instructions", *flags, flush=True)
    # .nv.constant / .nv.info also change with a new Cfg field that changes no instruction.
    print(f"{len(configs)} configs: {digest.hexdigest()} (instructions alone: {text.hexdigest()})")


if __name__ == "__main__":
    main()
