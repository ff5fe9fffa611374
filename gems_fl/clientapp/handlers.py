"""The node's answer to every message: one handler per round (:data:`HANDLERS`).

Flower's ``train``, ``query`` and ``evaluate`` all go to :func:`handle`, which reads the
round the message names (:mod:`gems_fl.protocol.rounds`) and calls that round's handler.
Each turns the message's settings into the node's settings (validated, with the node's
own overrides: :meth:`gems_fl.settings.Settings.for_node`) and its
:class:`~gems_fl.protocol.options.NodeWork`, loads the node's data, and hands both to
the reply builders of :mod:`gems_fl.protocol.node`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from gems_fl.data.agreement import DataAgreement
from gems_fl.data.node_cache import NodeDataCache
from gems_fl.data.nodes import (
    NodeData,
    NodeDataError,
    cast_node_arrays,
    load_node_data,
    node_name,
    own_node_config,
)
from gems_fl.heap import return_freed_blocks
from gems_fl.learning.train import set_default_device
from gems_fl.protocol import map_round, node, secure, wire
from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.rounds import Round, round_of
from gems_fl.settings import Settings
from gems_fl.settings.options import node_data_options, node_work

logger = logging.getLogger(__name__)
# a process that runs the ClientApp serves node after node (a simulation's actor imports
# this module when it receives the app, not gems_fl.apps): freed memory goes back
return_freed_blocks()
#: what this process loaded, for the later messages of the run (a simulation's ClientApp
#: process serves every message of its nodes; a deployed node's process is fresh each time)
LOADED = NodeDataCache()
#: a round's handler: the message, the node's context, the message's decoded config
Handler = Callable[[Message, Context, dict[str, Any]], Message]


def node_settings(config: Mapping[str, Any], context: Context) -> Settings:
    """The settings a message carries, validated, with this node's own overrides."""
    return Settings.from_node_config(config).for_node(context.node_config)


def _node_data(settings: Settings, config: Mapping[str, Any], context: Context) -> NodeData:
    node_config = own_node_config(context.node_config, settings.site_files)
    store = NodeStore(context)
    try:
        config = map_round.with_kept_map_part(
            dict(config), store, getattr(settings.model_kind.feature_map, "LARGE_CONFIG", None))
    except ValueError as exc:
        raise NodeDataError(f"node '{node_name(node_config)}': {exc}") from None
    agreement = DataAgreement.from_config(config)
    options = node_data_options(settings)
    folder = None
    try:
        folder = store.made() if store.disk else None
    except OSError as exc:  # a full or read-only disk: this process's memory alone
        logger.warning("node '%s': no folder for its rows (%s)", node_name(node_config), exc)
    return LOADED.get(options, node_config, agreement,
                      lambda: cast_node_arrays(load_node_data(options, node_config, agreement)),
                      folder=folder)


def _on_data(reply: Callable[..., Message], *, sets_device: bool = True,
             passes_config: bool = False) -> Handler:
    """A handler for a round that works on this node's data: the message's settings (with
    this node's own overrides), its data and its work, handed to ``reply`` (with the
    message's own keys where ``passes_config``; the compute device set where
    ``sets_device``: the rounds that train or score on the node's rows)."""
    def handle(msg: Message, context: Context, config: dict[str, Any]) -> Message:
        settings = node_settings(config, context)
        if sets_device:
            set_default_device(settings.device)
        extra = (config,) if passes_config else ()
        return reply(msg, context, _node_data(settings, config, context), node_work(settings),
                     *extra)
    return handle


def _map_round(msg: Message, context: Context, config: dict[str, Any]) -> Message:
    """Summaries of this node's rows for the model's map (the kernel model's class centres:
    :mod:`gems_fl.protocol.map_round`)."""
    settings = node_settings(config, context)
    round_ = settings.model_kind.map_round
    if round_ is None:
        raise ValueError(f"the server asks for the map round, and model '{settings.model}' has "
                         "none: run the same version of gems-fl on the server and every node")
    data = _node_data(settings, config, context)
    return Message(content=map_round.summaries_content(
        round_, data.x_train, data.y_train, float(config[map_round.SHARE_KEY]), settings.seed),
        reply_to=msg)


def _identify(msg: Message, context: Context, config: dict[str, Any]) -> Message:
    """Say who this node is and what data it holds.

    The server asks before the first round. The answer carries the node's name, the
    shape of its data, the class names it holds and, for ``standardize='federated'`` or
    the random-feature map's bandwidth, per-feature sums of its training rows. A node
    whose data cannot take part (an unreadable or malformed file, NaN, a wrong number of
    features or classes) answers with its name and the reason, so the server names it and
    leaves it out.
    """
    settings = Settings.from_node_config(config)
    try:
        node_config = own_node_config(context.node_config, settings.site_files)
        name = node_name(node_config)
    except NodeDataError as exc:
        raise NodeDataError(f"node id {context.node_id}: {exc}") from None
    source = str(node_config.get("data-path", "")) or "partition"
    try:
        data = load_node_data(node_data_options(settings), node_config)
    except NodeDataError as exc:
        logger.warning("%s", exc)
        return Message(content=wire.encode_identity_error(name, f"data-path={source}", str(exc)),
                       reply_to=msg)
    return node.identity_reply(msg, data, with_stats=settings.identity_sums)


def _last_round(handler: Handler) -> Handler:
    """``handler`` for the run's last round: afterwards (answered or not) the node removes
    the files it kept for the run (:meth:`NodeStore.forget`)."""
    def handle(msg: Message, context: Context, config: dict[str, Any]) -> Message:
        try:
            return handler(msg, context, config)
        finally:
            NodeStore(context).forget()
    return handle


#: how this node answers each round (:mod:`gems_fl.protocol.rounds`)
HANDLERS: dict[Round, Handler] = {
    Round.IDENTIFY: _identify,
    Round.MAP: _map_round,
    Round.SPACES: _on_data(node.spaces_reply, passes_config=True),
    Round.LAYER: _on_data(node.spaces_reply, passes_config=True),
    Round.SECURE_SUMS: _on_data(node.secure_sums_reply, sets_device=False),
    Round.SELECT: _on_data(node.selection_reply),
    Round.REFINE: _on_data(node.refine_reply),
    Round.LOCAL_MODEL: _on_data(node.local_model_reply),
    Round.VERIFY: _last_round(_on_data(node.evaluate_reply, sets_device=False)),
}


def handle(msg: Message, context: Context) -> Message:
    """Every message this node receives (``train``, ``query`` or ``evaluate``): answered
    by the handler of the round it names (:data:`HANDLERS`)."""
    config = secure.fit_config(msg) if secure.is_secure_fit(msg) else \
        wire.decode_config(msg.content)
    return HANDLERS[round_of(config, msg.metadata.message_type)](msg, context, config)


def build_client_app() -> ClientApp:
    """The GEMS ClientApp: ``train`` (the good-enough space), ``query`` (who this node is
    and what data it holds) and ``evaluate`` (score the server's models, h_G first, on
    this node's own data against its eps)."""
    app = ClientApp(mods=[secure.secure_mod])  # SecAgg+ for its own messages only
    for register in (app.train, app.query, app.evaluate):
        register()(handle)
    return app
