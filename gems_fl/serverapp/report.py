"""What the results file says about the rounds and the nodes: the refinement report of
either protocol, one row per node, per-node lists keyed by node name, and what the
server saw of the nodes' data (privacy)."""

from __future__ import annotations

from typing import Any

from gems_fl.geometry.dp import DPSpec
from gems_fl.protocol.roster import Roster
from gems_fl.protocol.verify import GEMS_KEY, Verification
from gems_fl.protocol.wire import SOLVE_METRIC_KEYS
from gems_fl.serverapp.protocol_run import ProtocolRun
from gems_fl.settings import PrivacySettings


def refinement_report(rounds: list[dict[str, Any]], scores: dict[int, float]) -> list[dict[str, Any]]:
    """Per protocol round: what it did (``spaces``: the one-shot ``h_G``; ``selection``:
    the pooled ridge and logit scale chosen on the nodes' validation data; ``step`` k),
    the test accuracy
    after it (None without a server test set), the pooled training loss the nodes
    reported at the model they were sent, and the protocol's bytes so far (identity round
    excluded)."""
    out, total = [], 0
    for i, r in enumerate(rounds):
        total += int(r.get("bytes_sent", 0)) + int(r.get("bytes_received", 0))
        kind = "spaces" if "refine" not in r else "selection" if r["refine"] == 0 else "step"
        out.append({"round": i + 1, "kind": kind, "step": r.get("refine") or None,
                    "temperature": r.get("temperature"), "pooled_ridge": r.get("pooled_ridge"),
                    "test_accuracy": scores.get(i + 1),
                    "loss_before": r.get("loss_before"), **_step_fields(r.get("step_report")),
                    "nodes": len(r.get("nodes", [])), "cumulative_bytes": total})
    return out


def _step_fields(report: dict[str, Any] | None) -> dict[str, Any]:
    """A refinement step's objective (loss plus the L2 penalty) at the model sent and,
    for ``refine-method=secant``, whether that model was kept and the curvature scale it
    was sent with."""
    report = report or {}
    return {"objective": report.get("objective"), "kept": report.get("kept"),
            "curvature": report.get("curvature")}


def layerwise_refinement_report(rounds: list[dict[str, Any]],
                                scores: dict[int, float]) -> list[dict[str, Any]]:
    """:func:`refinement_report` for the layer-wise protocol's rounds (``layer``: a hidden
    layer's round; ``spaces``: the output layer's one-shot point)."""
    out, total = [], 0
    for r in rounds:
        total += int(r.get("bytes_sent", 0)) + int(r.get("bytes_received", 0))
        kind = ("layer" if r["layer"] is not None else "selection" if r["selection"]
                else "step" if r["refine"] else "spaces")
        out.append({"round": r["round"], "kind": kind, "layer": r["layer"],
                    "step": r["refine"].get("step"),
                    "temperature": r["selection"].get("temperature"),
                    "pooled_ridge": r["selection"].get("pooled_ridge"),
                    "test_accuracy": scores.get(r["round"]),
                    "loss_before": r["refine"].get("loss_before"),
                    **_step_fields(r["refine"] or None), "nodes": len(r["nodes"]),
                    "cumulative_bytes": total})
    return out


def node_table(run: ProtocolRun, roster: Roster, verification: Verification,
               eps: float) -> list[dict[str, Any]]:
    """One row per accepted node, sorted by name: its space, whether ``h_G`` is inside,
    and what the node itself measured for ``h_G`` on its data (``eps``: the run's, for a
    node whose reply did not say its own)."""
    inter = run.outcome.intersection
    details = inter.details
    rows = []
    for k, (reply, inside, miss) in enumerate(zip(run.outcome.accepted, inter.inside, inter.miss)):
        check = verification.checks.get(reply.node_id)
        cert = reply.metrics.get("certified-radius", -1.0)
        own = None if check is None else check.space
        rows.append({
            "node_id": int(reply.node_id), "name": roster.names.get(reply.node_id, ""),
            "eps": float(reply.metrics.get("eps", eps)),
            "radius": reply.space.radius,
            "certified_radius": None if cert < 0 else float(cert),
            "distance": _optional(details["distance"][k]) if "distance" in details
            else float(reply.space.distance(inter.point)),
            "local_val_accuracy": reply.metrics["local-val-accuracy"],
            "num_train": int(reply.metrics["num-train-examples"]),
            "num_val": int(reply.metrics["num-val-examples"]),
            "inside": None if inside is None else bool(inside), "miss": _optional(miss),
            "inside_by_node": None if own is None else bool(own["inside"]),
            "h_g_val_accuracy": None if check is None else check.val.get(GEMS_KEY),
            "h_g_test_accuracy": None if check is None else check.test.get(GEMS_KEY),
            "good_enough": None if check is None else bool(check.good_enough),
            # fewer than MIN_VERDICT_ROWS validation rows: the verdict's rows and accuracy
            "verdict_rows": None if check is None else check.verdict_rows,
            "h_g_verdict_accuracy": None if check is None else check.verdict,
            **{key.replace("-", "_"): reply.metrics[key] for key in SOLVE_METRIC_KEYS
               if key in reply.metrics},
        })
    return sorted(rows, key=lambda r: r["name"])


def _optional(value: float | None) -> float | None:
    return None if value is None else float(value)


def keyed_by_name(report: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The intersection report with every per-node list (in reply order) as ``{name: value}``."""
    out = dict(report)
    for key, value in report.items():
        if isinstance(value, list) and len(value) == len(names) and key != "weights_order":
            out[key] = dict(sorted(zip(names, value)))
    return out


def privacy_record(privacy: PrivacySettings, release: DPSpec, holds_sums: bool) -> dict[str, Any]:
    """``results.json``'s ``privacy``: secure aggregation, what the server held and
    received, and the nodes' DP release (``release``, the run's
    :func:`~gems_fl.settings.options.dp_spec`; None without ``dp-epsilon``)."""
    return {"secure_aggregation": bool(privacy.secure_aggregation),
            "server_holds": "sums" if holds_sums else "every node's reply",
            "server_receives": server_receives(privacy), "dp": dp_record(privacy, release)}


def server_receives(privacy: PrivacySettings) -> str:
    """What of a node's statistics reaches the ServerApp in round 1."""
    if privacy.secure_aggregation:
        return "only the SecAgg+ sum of the nodes' statistics" + (
            " (each noised on its node)" if privacy.dp_epsilon else "")
    if privacy.dp_epsilon:
        return "each node's noised sums (no model)"
    return "each node's reply (its model and statistics)"


def dp_record(privacy: PrivacySettings, release: DPSpec) -> dict[str, Any] | None:
    """What the results say of the nodes' DP release (None when ``dp-epsilon`` is 0): the
    guarantee each node's statistics keep, from the accountant, and what it covers."""
    if not privacy.dp_epsilon:
        return None
    return {**release.report(bool(privacy.dp_seeded_noise)),
            "covers": "each node's training rows, for everything computed from its noised "
                      "sums (the Gram matrix and label moments; the model)",
            "not_covered": "the scalars a node still reports: its row counts, its radius, "
                           "its validation accuracies and losses (validation rows), the "
                           "distance of h_G from its own space"}
