"""_launch's programmatic-dependent-launch path on the CPU: the ctypes mirrors of the driver's
launch structs have CUDA 12's layout (cuda.h: CUlaunchAttribute is an id padded to 8 bytes and a
64-byte value union, 72 bytes; CUlaunchConfig is seven unsigned ints, the stream, the attribute
pointer and their count, 56 bytes), and the one attribute sent allows programmatic serialization."""
import ctypes

from cupy_moe import _launch


def test_launch_structs_have_the_drivers_layout():
    A, C = _launch._LaunchAttribute, _launch._LaunchConfig
    assert ctypes.sizeof(A) == 72 and A.value.offset == 8
    assert ctypes.sizeof(C) == 56
    assert (C.shared_mem.offset, C.stream.offset, C.attrs.offset, C.num_attrs.offset) == (24, 32, 40, 48)


def test_the_attribute_allows_programmatic_stream_serialization():
    attr = _launch._PDL_ATTRIBUTE
    assert attr.id == 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value[0] == 1 and not any(attr.value[1:])
