"""gems-fl: GEMS (Model Aggregation via Good-Enough Model Spaces) on Flower."""

__version__ = "0.1.0"
