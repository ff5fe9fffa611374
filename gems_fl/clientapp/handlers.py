"""The Flower handlers a node registers: ``train``, ``query`` and ``evaluate``.

Each turns its message's settings into the node's settings (validated, with the node's
own overrides: :meth:`gems_fl.settings.Settings.for_node`) and its
:class:`~gems_fl.protocol.options.NodeWork`, loads the node's data, and hands both to
the reply builders of :mod:`gems_fl.protocol.node`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
from gems_fl.learning.train import set_default_device
from gems_fl.protocol import landmarks, node, secure, wire
from gems_fl.settings import Settings
from gems_fl.settings.options import node_data_options, node_work

logger = logging.getLogger(__name__)
#: what this process loaded, for the later messages of the run (a simulation's ClientApp
#: process serves every message of its nodes; a deployed node's process is fresh each time)
LOADED = NodeDataCache()


def node_settings(config: Mapping[str, Any], context: Context) -> Settings:
    """The settings a message carries, validated, with this node's own overrides."""
    return Settings.from_node_config(config).for_node(context.node_config)


def _node_data(settings: Settings, config: Mapping[str, Any], context: Context) -> NodeData:
    node_config = own_node_config(context.node_config, settings.site_files)
    try:
        config = landmarks.with_kept_landmarks(dict(config), context.state)
    except ValueError as exc:
        raise NodeDataError(f"node '{node_name(node_config)}': {exc}") from None
    agreement = DataAgreement.from_config(config)
    options = node_data_options(settings)
    return LOADED.get(options, node_config, agreement,
                      lambda: cast_node_arrays(load_node_data(options, node_config, agreement)))


def handle_train(msg: Message, context: Context) -> Message:
    """Flower ``train`` handler: a round of the protocol, or SecAgg+'s fit instruction."""
    if secure.is_secure_fit(msg):
        config = secure.fit_config(msg)
        settings = node_settings(config, context)
        return node.secure_sums_reply(msg, context, _node_data(settings, config, context),
                                      node_work(settings))
    config = wire.decode_config(msg.content)
    settings = node_settings(config, context)
    set_default_device(settings.device)
    return node.train_reply(msg, context, _node_data(settings, config, context),
                            node_work(settings), config)


def handle_evaluate(msg: Message, context: Context) -> Message:
    """Flower ``evaluate`` handler: score the server's models on this node's own data
    against its own eps (:func:`gems_fl.protocol.node.evaluate_reply`)."""
    config = wire.decode_config(msg.content)
    settings = node_settings(config, context)
    return node.evaluate_reply(msg, context, _node_data(settings, config, context),
                               node_work(settings))


def handle_query(msg: Message, context: Context) -> Message:
    """Flower ``query`` handler: say who this node is and what data it holds (or, for
    ``model='kernel'``, send the class centres of its rows: :mod:`gems_fl.protocol.landmarks`).

    The server asks before the first round. The answer carries the node's name, the
    shape of its data, the class names it holds and, for ``standardize='federated'`` or
    the random-feature map's bandwidth, per-feature sums of its training rows. A node
    whose data cannot take part (an unreadable or malformed file, NaN, a wrong number of
    features or classes) answers with its name and the reason, so the server names it and
    leaves it out.
    """
    config = wire.decode_config(msg.content)
    settings = Settings.from_node_config(config)
    if landmarks.is_landmark_query(config):  # model='kernel', after the identity round
        data = _node_data(node_settings(config, context), config, context)
        return Message(content=landmarks.landmarks_content(
            data.x_train, data.y_train, float(config[landmarks.SHARE_KEY]), settings.seed),
            reply_to=msg)
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


def build_client_app() -> ClientApp:
    """The GEMS ClientApp: ``train`` (the good-enough space), ``query`` (who this node is
    and what data it holds) and ``evaluate`` (score the server's models, h_G first, on
    this node's own data against its eps)."""
    app = ClientApp(mods=[secure.secure_mod])  # SecAgg+ for its own messages only
    app.train()(handle_train)
    app.query()(handle_query)
    app.evaluate()(handle_evaluate)
    return app
