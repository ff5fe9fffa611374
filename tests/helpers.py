"""Helpers for driving the real ServerApp/ClientApp code in-process."""

from __future__ import annotations

import tomllib
from pathlib import Path

from flwr.app import Context, RecordDict

from client_app import app as client_app
from gems_fl.protocol.inprocess import InProcessGrid
from gems_fl.serverapp import run_server

ROOT = Path(__file__).resolve().parents[1]

FAST = {"num-directions": 30, "local-max-epochs": 15, "public-samples": 200}


def app_defaults() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def run_in_process(num_nodes: int, tmp_path: Path, reply_hook=None, node_configs=None,
                   return_grid: bool = False, evaluate_hook=None, client=None, **overrides):
    """One GEMS run through the real apps over an in-process Grid; returns results.

    ``client`` replaces the ClientApp (e.g. a wrapper that records what nodes receive)."""
    cfg = {**app_defaults(), **FAST, "output-dir": str(tmp_path), **overrides}
    grid = InProcessGrid(client or client_app, num_nodes, cfg, reply_hook=reply_hook,
                         node_configs=node_configs, evaluate_hook=evaluate_hook)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    try:
        results = run_server(grid, ctx)
    finally:
        grid.forget_node_files()
    return (results, grid) if return_grid else results


def node_unavailable(node_id: int):
    """A reply hook: ``node_id``'s reply becomes the error Flower's SuperLink sends for a
    dead node (NODE_UNAVAILABLE, from the SuperLink's own id)."""
    from flwr.app import Error, Message
    from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

    def hook(reply):
        if reply.metadata.src_node_id != node_id:
            return reply
        error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                        reply_to=reply)
        error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        error.metadata.__dict__["_reply_to_message_id"] = reply.metadata.reply_to_message_id
        return error
    return hook
