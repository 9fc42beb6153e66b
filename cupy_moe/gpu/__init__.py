"""The CuPy path: one module per stage, each a thin launcher over a kernel family in cuda_src."""
