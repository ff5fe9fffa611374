"""The GEMS protocol on Flower's Message API.

Owns the wire format (``wire``) and the checks of every reply (``replies``), what a node
does (convex and layer-wise), the strategies and their shared state (``base``), the
identity and evaluate rounds, and the in-process Grid used by the tests and the
reproduction harness. Everything here takes explicit option objects (``options``), built
from the run settings by :mod:`gems_fl.settings.options`. Imports geometry, learning, data
and Flower; never settings, evaluation, serverapp, clientapp or running.
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
    "options",
    "private",
    "replies",
    "roster",
    "rounds",
    "secure",
    "selection_round",
    "strategy",
    "verify",
    "wire",
]
