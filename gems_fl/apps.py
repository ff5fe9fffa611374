"""The Flower apps: the ServerApp (:func:`gems_fl.serverapp.run_server`) and the ClientApp
(:func:`gems_fl.clientapp.build_client_app`). ``server_app.py`` and ``client_app.py`` at
the checkout's root serve them; so does the app the installed package carries
(:mod:`gems_fl.running.packaged_app`), which ``gems-fl run`` uses from any folder."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from gems_fl.clientapp import build_client_app
from gems_fl.serverapp import run_server

__all__ = ["client_app", "server_app"]

server_app = ServerApp()
client_app = build_client_app()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Run GEMS over the connected nodes and write the results."""
    run_server(grid, context)
