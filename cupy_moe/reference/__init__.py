"""NumPy reference implementations: the oracle for every GPU test (see each module's rounding notes)."""
from . import layer, routing, sol080
from .precision import BF16, FLOAT64, Precision, precision_for

__all__ = ["layer", "routing", "sol080", "Precision", "BF16", "FLOAT64", "precision_for"]
