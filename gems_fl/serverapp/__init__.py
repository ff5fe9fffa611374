"""The ServerApp's run, beside the protocol it drives: settings and preflight, the
identity round, the GEMS rounds (:mod:`gems_fl.protocol`), the evaluate round on the
nodes, the baselines (:mod:`gems_fl.evaluation`) and the results on disk.

``server_app.py`` (what ``flwr run`` loads) and the reproduction harness both call
:func:`run_server`. Imports protocol, evaluation, learning, data and Flower; never
``running`` (the operator's tools outside Flower) or ``reproduce``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gems_fl.serverapp.run import run_server

__all__ = ["run_server"]


def __getattr__(name: str) -> Any:
    # `gems-fl run` checks its settings with `gems_fl.serverapp.preflight` before the run
    # itself (torch, scikit-learn, Flower) is imported: only a run loads it.
    if name == "run_server":
        from gems_fl.serverapp.run import run_server

        return run_server
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
