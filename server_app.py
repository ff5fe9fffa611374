"""Flower ServerApp for GEMS: thin glue, the work is in ``gems_fl.serverapp``."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from gems_fl.serverapp import run_server

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run GEMS over the connected nodes and write the results."""
    run_server(grid, context)
