"""tools/ncu_opcodes.py: per-opcode counts read from an ncu report's protobuf records."""
import importlib.util
import os
import struct

_path = os.path.join(os.path.dirname(__file__), "..", "tools", "ncu_opcodes.py")
_spec = importlib.util.spec_from_file_location("ncu_opcodes", _path)
ncu_opcodes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_opcodes)


def _record(name: str, value: float) -> bytes:
    inner = bytes([0x0A, len(name)]) + name.encode()
    return bytes([0x1A, len(inner) + 13, 0x0A, len(inner)]) + inner + b"\x12\x09\x19" + struct.pack("<d", value)


def test_reads_opcodes_with_modifiers_and_keeps_the_largest_value_per_name():
    data = (b"\x00junk" + _record("HGMMA", 5853056.0) + _record("HGMMA.64x256x16.F32.BF16", 5853056.0)
            + _record("STS", 11.0) + _record("STS", 7.0) + _record("BRA", 0.5)
            + _record("NOP", float("nan")) + _record("EXIT", float("inf")) + b"tail")
    got = ncu_opcodes.opcode_counts(data)
    assert got == {"HGMMA": 5853056, "HGMMA.64x256x16.F32.BF16": 5853056, "STS": 11}  # 0.5, NaN, inf: no count


def test_a_name_whose_length_byte_disagrees_is_not_read():
    bad = bytearray(_record("HGMMA", 3.0))
    bad[5] = 4  # the name's length byte no longer matches the name
    assert ncu_opcodes.opcode_counts(bytes(bad)) == {}
