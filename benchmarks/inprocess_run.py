"""One GEMS run through the real ServerApp and ClientApp code over the in-process Grid,
as the benchmarks time it: ``run_apps(cfg, nodes) -> (results, grid, wall seconds)``;
``grid.exchanges`` holds the bytes of every message up and down."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it


def run_apps(cfg: dict, nodes: int, run_id: int = 1):
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server

    grid = InProcessGrid(client_app, nodes, cfg)
    ctx = Context(run_id=run_id, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    t0 = time.perf_counter()
    results = run_server(grid, ctx)
    return results, grid, time.perf_counter() - t0
