"""cupy_moe: the Mixture-of-Experts layer's forward and backward as CUDA kernels for Hopper, driven
from CuPy, with a NumPy reference behind the same functions."""
from ._arrays import bfloat16
from .api import moe_backward, moe_forward, sol080_backward
from .config import MoEConfig
from .context import MoEContext, MoEGradients

__all__ = ["MoEConfig", "MoEContext", "MoEGradients", "bfloat16", "moe_backward", "moe_forward",
           "sol080_backward"]
__version__ = "0.1.0"
