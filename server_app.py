"""Flower ServerApp for GEMS: thin glue, the work is in ``gems_fl.serverapp``
(the app itself: ``gems_fl.apps.server_app``)."""

from gems_fl.apps import server_app as app

__all__ = ["app"]
