"""Per-opcode executed-instruction counts from an ncu report, on a machine without ncu.

`ncu --section InstructionStats -o NAME ...` stores sass__inst_executed_per_opcode as protobuf
records whose opcode names and double values are in the clear: a record is
`0a <len> 0a <len> NAME 12 09 19 <8-byte little-endian double>`. This reads those records (no
schema; the format is ncu's and may change: a report with none found says so).
Why it exists: a probe that removes work can let the compiler remove more than asked (bench/NOTES.md
v0.54: dead accumulators shrank every wgmma to 64x8x16); compare the HGMMA counts and shapes of a
probe against the full kernel before reading its time.
Usage: python tools/ncu_opcodes.py REPORT.ncu-rep [REPORT ...] [--grep HGMMA]"""
import argparse
import math
import re
import struct

_RECORD = re.compile(rb"\x0a[\x01-\x7f]\x0a([\x01-\x7f])([A-Z][A-Za-z0-9_.]*)\x12\x09\x19(.{8})", re.S)


def opcode_counts(data: bytes) -> dict:
    """{opcode (with modifiers where ncu gives them): count}; the largest value where one name
    appears in several metrics (per opcode, per opcode with modifiers)."""
    counts = {}
    for m in _RECORD.finditer(data):
        name = m.group(2)
        if len(name) != m.group(1)[0]:
            continue
        value = struct.unpack("<d", m.group(3))[0]
        if math.isfinite(value) and value >= 0 and value == int(value):  # (stray bytes: NaN, inf)
            key = name.decode()
            counts[key] = max(counts.get(key, 0), int(value))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--grep", default="", help="only opcodes containing this text")
    args = ap.parse_args()
    for path in args.reports:
        with open(path, "rb") as f:
            counts = opcode_counts(f.read())
        shown = {k: v for k, v in counts.items() if args.grep in k}
        print(f"== {path}: {len(counts)} opcodes" + ("" if counts else " (no records: another ncu format?)"))
        for k, v in sorted(shown.items(), key=lambda kv: -kv[1]):
            print(f"{v:>16,d}  {k}")


if __name__ == "__main__":
    main()
