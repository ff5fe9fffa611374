"""Flower ClientApp for GEMS: thin glue, the work is in ``gems_fl.protocol.node``."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from gems_fl.protocol.node import handle_evaluate, handle_query, handle_train

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train locally and reply with this node's good-enough model space."""
    return handle_train(msg, context)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Say who this node is and what data it holds (checked against the run)."""
    return handle_query(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Score the server's models (h_G first) on this node's own data against its eps."""
    return handle_evaluate(msg, context)
