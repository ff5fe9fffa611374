"""Models and how they are trained: one ``build_model`` for the logistic model and an
MLP of any depth, training until convergence, fine-tuning, the training cache and the
thread policy.

Imports numpy and torch only: no geometry, data, protocol or Flower.
"""

#: the public modules (each says what it exports)
__all__ = [
    "models",
    "recipe",
    "threads",
    "train",
    "train_cache",
    "widths",
]
