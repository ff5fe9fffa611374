"""The ServerApp's run, beside the protocol it drives: settings and preflight, the
identity round, the GEMS rounds (:mod:`gems_fl.protocol`), the evaluate round on the
nodes, the baselines (:mod:`gems_fl.evaluation`) and the results on disk.

``server_app.py`` (what ``flwr run`` loads) and the reproduction harness both call
:func:`run_server`. Imports protocol, evaluation, learning, data and Flower; never
``running`` (the operator's tools outside Flower) or ``reproduce``.
"""

from gems_fl.serverapp.run import run_server

__all__ = ["run_server"]
