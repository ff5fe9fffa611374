"""The wire format, reply validation and the round going on without bad replies."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from flwr.app import Array, Error, Message, RecordDict

from client_app import app as client_app
from gems_fl.protocol import replies, space_replies, wire
from gems_fl.protocol.attendance import RequiredNodesMissing
from gems_fl.protocol.inprocess import InProcessGrid
from gems_fl.protocol.replies import NotEnoughRepliesError
from gems_fl.protocol.rounds import Round, round_messages
from gems_fl.settings import Settings
from tests.helpers import FAST, app_defaults, run_in_process

# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def _client_reply(space: str) -> RecordDict:
    cfg = {**app_defaults(), **FAST, "space": space}
    grid = InProcessGrid(client_app, 5, cfg)
    content = wire.encode_config(Settings.from_run_config(cfg).to_config())
    (reply,) = grid.send_and_receive(round_messages(Round.SPACES, content, [1000], group_id="1"))
    assert not reply.has_error(), reply.error
    return reply.content


@pytest.mark.parametrize("space", ["ball", "ellipsoid"])
def test_reply_holds_exactly_the_space_and_counts(space):
    content = _client_reply(space)
    expected = {"center", "metrics"} | ({"axes"} if space == "ellipsoid" else set())
    assert set(content.keys()) == expected
    assert set(content.array_records["center"].keys()) == {"weight", "bias"}
    assert content.array_records["center"]["weight"].numpy().shape == (10, 64)
    assert content.array_records["center"]["bias"].numpy().shape == (10,)
    if space == "ellipsoid":
        axes = content.array_records["axes"]
        assert {k: axes[k].numpy().shape for k in axes.keys()} == {"weight": (10, 64), "bias": (10,)}
    # the exact solve's report beside the space's metrics
    assert set(content.metric_records["metrics"].keys()) == {*wire.METRIC_KEYS,
                                                             *wire.SOLVE_METRIC_KEYS}
    assert not content.config_records


SHAPES = {"weight": (10, 64), "bias": (10,)}


def _good_reply() -> RecordDict:
    return wire.encode_reply({"weight": np.zeros((10, 64)), "bias": np.zeros(10)}, None,
                             radius=1.0, certified_radius=0.5, eps=0.4,
                             num_train_examples=10, num_val_examples=5,
                             local_val_accuracy=0.9)


def test_decode_accepts_good_reply():
    space, metrics = space_replies.decode_reply(_good_reply(), SHAPES, "ball")
    assert space.dim == 650 and space.radius == 1.0 and metrics["num-val-examples"] == 5


def _nan(c):
    w = np.zeros((10, 64))
    w[3, 3] = np.nan
    c["center"]["weight"] = Array(w)


def _wrong_shape(c):
    c["center"]["weight"] = Array(np.zeros((10, 63)))


def _negative_radius(c):
    c["metrics"]["radius"] = -0.5


def _missing_key(c):
    del c["metrics"]["num-val-examples"]


def _missing_record(c):
    del c["center"]


CORRUPTIONS = {
    "nan": (_nan, "NaN"),
    "wrong-shape": (_wrong_shape, "shape"),
    "negative-radius": (_negative_radius, "negative"),
    "missing-key": (_missing_key, "num-val-examples"),
    "missing-record": (_missing_record, "missing \\['center'\\]"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_decode_rejects_bad_reply(name):
    corrupt, reason = CORRUPTIONS[name]
    content = _good_reply()
    corrupt(content)
    with pytest.raises(replies.ReplyError, match=reason):
        space_replies.decode_reply(content, SHAPES, "ball")


def test_bad_replies_are_dropped_and_the_round_goes_on(tmp_path, caplog):
    """Four nodes send a corrupt reply each; the two good ones still aggregate."""
    bad = {1000: "nan", 1001: "wrong-shape", 1002: "negative-radius", 1003: "missing-key"}

    def hook(reply: Message) -> Message:
        name = bad.get(reply.metadata.src_node_id)
        if name:
            CORRUPTIONS[name][0](reply.content)
        return reply

    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        results = run_in_process(6, tmp_path, **NO_CHECK, reply_hook=hook, space="ball",
                                 **{"label-division": "classes-per-node:2", "required-nodes": "2"})
    finally:
        flwr_logger.removeHandler(caplog.handler)
    assert results["status"] == "completed"
    sites = results["attendance"]
    assert sites["ok"] and sites["completed"] == ["partition-4", "partition-5"]
    assert sites["line"].startswith("completed with 2 of 6 sites; left out: partition-0 ("
                                    "'center.weight' contains NaN")
    assert [e["stage"] for e in sites["left_out"]] == ["rounds"] * 4
    rejected = {r["node_id"]: r["reason"] for r in results["rejected"]}
    assert set(rejected) == set(bad)
    assert "NaN" in rejected[1000] and "shape" in rejected[1001]
    assert "negative" in rejected[1002] and "num-val-examples" in rejected[1003]
    for node_id in bad:
        assert any(f"node {node_id}" in r.getMessage() for r in caplog.records)
    assert sorted(n["node_id"] for n in results["nodes"]) == [1004, 1005]
    assert results["rows"]["GEMS"]["accuracy"] is not None
    saved = json.loads((tmp_path / "run-1" / "results.json").read_text())
    assert saved["rejected"] == results["rejected"]


def test_client_exception_becomes_a_rejection(tmp_path):
    # An error reply (as Flower sends for a crashed ClientApp) is rejected, not fatal.
    results = run_in_process(3, tmp_path, space="ball", dataset="digits",
                             reply_hook=_error_for(1000), **{"required-nodes": "partition-1"})
    assert [r["node_id"] for r in results["rejected"]] == [1000]
    assert "client error" in results["rejected"][0]["reason"]
    assert len(results["nodes"]) == 2
    assert results["attendance"]["line"].startswith("completed with 2 of 3 sites; left out: "
                                                    "partition-0 (disk full)")


def test_a_required_site_left_out_fails_the_run_after_writing_its_results(tmp_path):
    """Default required-nodes='all': every node present at the identity round must take
    part to the end; the run still writes its results, marked incomplete, then fails."""
    with pytest.raises(RequiredNodesMissing) as failure:
        run_in_process(3, tmp_path, space="ball", dataset="digits", reply_hook=_error_for(1000))
    assert str(failure.value).startswith(
        "completed with 2 of 3 sites; left out: partition-0 (disk full)")
    assert "required-nodes='all' is not met: missing partition-0" in str(failure.value)
    saved = json.loads((tmp_path / "run-1" / "results.json").read_text())
    assert saved["status"] == "incomplete"
    assert saved["attendance"]["missing_required"] == ["partition-0"]
    assert saved["attendance"]["completed"] == ["partition-1", "partition-2"]
    # A count or names that the sites left meet: completed.
    for required in ("2", "partition-1,partition-2"):
        results = run_in_process(3, tmp_path / required, space="ball", dataset="digits",
                                 reply_hook=_error_for(1000), **{"required-nodes": required})
        assert results["status"] == "completed" and results["attendance"]["ok"]
    with pytest.raises(RequiredNodesMissing, match="2 site.s. took part, 3 required"):
        run_in_process(3, tmp_path / "three", space="ball", dataset="digits",
                       reply_hook=_error_for(1000), **{"required-nodes": "3"})

def test_a_required_site_missing_or_rejected_stops_the_run_before_any_training(tmp_path):
    """The identity round knows the sites the run expects: a required site that is rejected
    there (required-nodes='all') or never connects (named) stops the run before any
    training, each site named with why; the results say so, with no model."""
    from client_app import app as client_app

    received = []

    def recording_app(msg, context):
        received.append(msg.metadata.message_type)
        return client_app(msg, context)

    bad = [{"partition-id": 0, "num-partitions": 3},
           {"partition-id": 1, "num-partitions": 3},
           {"data-path": str(tmp_path / "nowhere.npz"), "node-name": "site-x"}]
    with pytest.raises(RequiredNodesMissing) as failure:
        run_in_process(3, tmp_path / "all", node_configs=bad, client=recording_app)
    assert str(failure.value).startswith(
        "stopped before training: expected every site present (required-nodes='all'); heard "
        "from 3 site(s) (partition-0, partition-1, site-x); missing: site-x (rejected: ")
    assert set(received) == {"query"}  # the identity round, nothing after it
    folder = tmp_path / "all" / "run-1"
    saved = json.loads((folder / "results.json").read_text())
    assert saved["status"] == "incomplete" and saved["stage"] == "identity"
    assert saved["attendance"]["missing_required"] == ["site-x"]
    assert not (folder / "gems_model.npz").exists()
    with pytest.raises(RequiredNodesMissing, match=r"missing: site-y \(not connected after "):
        run_in_process(2, tmp_path / "named", **{"site-wait": 1.0,
                                                 "required-nodes": "partition-0,site-y"})
    with pytest.raises(RequiredNodesMissing, match=r"1 more site\(s\) \(not connected after"):
        run_in_process(2, tmp_path / "count", **{"site-wait": 1.0, "required-nodes": "3"})


def test_the_sites_line_lists_the_sites_expected_and_heard_from(tmp_path):
    results = run_in_process(3, tmp_path, space="ball", dataset="digits",
                             **{"required-nodes": "partition-0,partition-2"})
    assert results["attendance"]["roll"] == (
        "expected partition-0, partition-2 (required-nodes='partition-0,partition-2'); heard "
        "from 3 site(s) (partition-0, partition-1, partition-2)")


def test_a_registered_name_is_the_sites_name(tmp_path):
    """Under SuperNode authentication the SuperLink gives each connected node the name the
    operator registered it under: the run calls the site by it, over its node-name."""
    from flwr.app import Context
    from flwr.proto.node_pb2 import NodeInfo

    from gems_fl.serverapp.run import run_server
    from tests.helpers import app_defaults as defaults

    class RegisteredGrid(InProcessGrid):
        def get_nodes(self):
            return [NodeInfo(node_id=n, name=f"hospital-{n - 1000}") for n in self.get_node_ids()]

    cfg = {**defaults(), **FAST, "output-dir": str(tmp_path), "space": "ball",
           "required-nodes": "hospital-0,hospital-1,hospital-2"}
    grid = RegisteredGrid(client_app, 3, cfg)
    results = run_server(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                       run_config=cfg))
    assert [n["name"] for n in results["nodes"]] == ["hospital-0", "hospital-1", "hospital-2"]
    assert results["attendance"]["completed"] == ["hospital-0", "hospital-1", "hospital-2"]


def test_a_model_good_enough_on_too_few_sites_fails_the_run_after_writing_its_results(tmp_path):
    """A site whose eps h_G cannot reach counts against it: with two of three sites at
    eps 0.999, h_G is good enough on 1 of 3, below the default majority (2): the results are
    written, marked not-good-enough with the figures, then the run fails (gems-fl: exit 4)."""
    from gems_fl.protocol.attendance import ModelNotGoodEnough
    from gems_fl.running.outcome import RunNotGoodEnough, incomplete_run

    strict = [{"partition-id": k, "num-partitions": 3, **({"eps": 0.999} if k < 2 else {})}
              for k in range(3)]
    with pytest.raises(ModelNotGoodEnough, match=r"good enough on 1 of 3 site\(s\) that "
                       r"checked it; min-good-enough=majority asks for 2"):
        run_in_process(3, tmp_path, node_configs=strict)
    path = tmp_path / "run-1" / "results.json"
    saved = json.loads(path.read_text())
    assert saved["status"] == "not-good-enough"
    assert saved["good_enough"] == {**saved["good_enough"], "sites": 1, "checked": 3,
                                    "required": 2, "ok": False}
    assert saved["verification"]["good_enough"] == 1
    error, line = incomplete_run(path)
    assert error is RunNotGoodEnough and error.exit_code == 4 and "1 of 3" in line
    results = run_in_process(3, tmp_path / "one", node_configs=strict,
                             **{"min-good-enough": "1"})
    assert results["status"] == "completed" and results["good_enough"]["ok"]


def _error_for(node_id: int):
    def hook(reply: Message) -> Message:
        if reply.metadata.src_node_id != node_id:
            return reply
        return Message(Error(code=7, reason="disk full"), reply_to=_request_of(reply))
    return hook


def _request_of(reply: Message) -> Message:
    """A stand-in request whose metadata lets Message build an error reply."""
    req = Message(RecordDict(), dst_node_id=reply.metadata.src_node_id,
                  message_type=reply.metadata.message_type, group_id=reply.metadata.group_id)
    req.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    return req


def test_too_few_valid_replies_stops_with_a_clear_error(tmp_path):
    def hook(reply: Message) -> Message:
        if reply.metadata.src_node_id != 1000:
            _negative_radius(reply.content)
        return reply

    with pytest.raises(NotEnoughRepliesError, match="only 1 valid reply.*min-replies=2"):
        run_in_process(3, tmp_path, reply_hook=hook, space="ball")


def test_a_window_of_messages_in_flight_gives_the_run_of_the_plain_grid(tmp_path):
    """WindowedGrid (Flower's simulation) sends in a sliding window; the run is the same."""
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server
    from gems_fl.serverapp.window import WindowedGrid
    from tests.helpers import FAST, app_defaults

    results = {}
    for name, window in (("plain", None), ("window", 2)):
        cfg = {**app_defaults(), **FAST, "output-dir": str(tmp_path / name)}
        grid = InProcessGrid(client_app, 5, cfg)
        pushed = []

        def counting_push(messages, push=grid.push_messages, pushed=pushed):
            batch = list(messages)
            pushed.append(len(batch))
            return push(batch)

        grid.push_messages = counting_push
        ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
        results[name] = run_server(grid if window is None else WindowedGrid(grid, window), ctx)
        if window is not None:  # every round went out two messages at a time
            assert pushed == [2, 2, 1] * 4  # identify, spaces, selection, evaluate
    assert results["window"]["rows"] == results["plain"]["rows"]
    assert results["window"]["nodes"] == results["plain"]["nodes"]


@pytest.mark.parametrize("window", [None, 1])
def test_a_dead_node_is_named_when_the_grid_hands_replies_on_as_they_arrive(tmp_path, window):
    """Flower answers for a dead node from the SuperLink's own id; a grid that pushes the
    messages as its replies are read (deployed: all at once; simulation: a window) still
    has the reply named by the message it answers."""
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server
    from gems_fl.serverapp.window import WindowedGrid
    from tests.helpers import FAST, app_defaults, node_unavailable

    cfg = {**app_defaults(), **FAST, "output-dir": str(tmp_path), "required-nodes": "0"}
    grid = InProcessGrid(client_app, 3, cfg, reply_hook=node_unavailable(1002))
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    try:
        results = run_server(WindowedGrid(grid, window), ctx)
    finally:
        grid.forget_node_files()
    (rejected,) = results["rejected"]
    assert rejected["node_id"] == 1002 and rejected["node_name"] == "partition-2"
    assert "node unavailable" in rejected["reason"]
