"""The GEMS protocol on Flower's Message API.

Owns the wire format (``wire``) and the checks of every reply (``replies``), what a node
does (convex and layer-wise), the strategies and their shared state (``base``), the
identity and evaluate rounds, and the in-process Grid used by the tests and the
reproduction harness. Imports geometry, learning, data, settings and Flower; never
evaluation, serverapp or running.
"""

#: the public modules (each says what it exports)
__all__ = [
    "attendance",
    "base",
    "inprocess",
    "layerwise",
    "local_models",
    "node",
    "node_layerwise",
    "private",
    "replies",
    "roster",
    "secure",
    "selection_round",
    "strategy",
    "verify",
    "wire",
]
