"""The geometry of good-enough model spaces: plain numpy/torch/scikit-learn code.

Owns the spaces (ball, Fisher ellipsoid, logit-space Gram ellipsoid), the batched
radius searches, the Fisher axes, the intersection of spaces, the per-neuron spaces
and the layer merge. Imports numpy, torch, scipy and scikit-learn only: nothing from
Flower or from the rest of ``gems_fl``, so every piece can be tested on its own.
"""

#: the public modules (each says what it exports)
__all__ = [
    "ball_meet",
    "certify",
    "choices",
    "class_factors",
    "components",
    "dp",
    "eps",
    "fisher",
    "gram",
    "gram_merge",
    "gram_search",
    "gram_sums",
    "greedy_merge",
    "intersect",
    "kinds",
    "layer_merge",
    "neurons",
    "pooled",
    "radius",
    "refine",
    "selection",
    "spaces",
    "virtual",
]
