"""Flower ClientApp for GEMS: thin glue, the handlers are in ``gems_fl.clientapp``.

``train`` replies with this node's good-enough model space, ``query`` says who the node
is and what data it holds, ``evaluate`` scores the server's models (h_G first) on the
node's own data against its eps.
"""

from gems_fl.apps import client_app as app

__all__ = ["app"]
