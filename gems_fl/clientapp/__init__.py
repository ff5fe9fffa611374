"""The ClientApp's handlers, beside the protocol they serve: each message's settings
parsed and checked (with the node's own overrides), the node's data loaded, and the
reply built by :mod:`gems_fl.protocol.node` from the node's
:class:`~gems_fl.protocol.options.NodeWork`.

``client_app.py`` (what a SuperNode loads) and the in-process Grid of the tests and the
reproduction serve :func:`build_client_app`. Imports protocol, settings, data, learning
and Flower; never serverapp, evaluation, running or reproduce.
"""

from gems_fl.clientapp.handlers import build_client_app

__all__ = ["build_client_app"]
