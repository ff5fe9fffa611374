"""The geometry of good-enough model spaces: plain numpy/torch/scikit-learn code.

Owns the spaces (ball, Fisher ellipsoid, logit-space Gram ellipsoid), the batched
radius searches, the Fisher axes, the intersection of spaces, the per-neuron spaces
and the layer merge. Imports numpy, torch, scipy and scikit-learn only: nothing from
Flower or from the rest of ``gems_fl``, so every piece can be tested on its own.
"""
