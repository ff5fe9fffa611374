"""gems-fl: GEMS (Model Aggregation via Good-Enough Model Spaces) on Flower."""

__version__ = "0.1.0"

#: ``gems_fl.api`` is the Flower-free Python API; the rest is reached by sub-package
__all__ = ["__version__", "api"]
