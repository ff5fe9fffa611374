"""Before the first round: ask every node who it is and check its data fits the run.

The server sends each connected node a ``query`` message carrying the run settings;
the node answers with its stable name (``node-name`` in its node config) and the shape
of its data (:data:`gems_fl.clientapp.handlers.HANDLERS`). A node whose data does not fit (a
wrong number of features or classes, an unreadable file) answers with an error that
names the problem; it is logged with its node id, recorded in the results and left
out of every round. The node names are used from then on in logs and results, since
Flower gives a restarted SuperNode a new node id.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import partial
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.data.agreement import NODE_FILES, DataAgreement, Scaling
from gems_fl.data.categories import agreed_levels, base_of, complete_columns
from gems_fl.data.datasets import DATASET_SHAPES
from gems_fl.data.feature_map import FeatureMap, MapEvidence, NodeEvidence
from gems_fl.data.site_columns import column_difference, vote_columns
from gems_fl.data.site_files import (
    combine_stats,
    parse_classes,
    sort_classes,
)
from gems_fl.naming import MAX_NODES_NAMED
from gems_fl.protocol import wire
from gems_fl.protocol.identity_replies import Identity, decode_identity_full
from gems_fl.protocol.map_round import collect_summaries
from gems_fl.protocol.options import AgreementRule, Exchange
from gems_fl.protocol.replies import validate_replies
from gems_fl.protocol.rounds import Round, round_messages, sent_bytes


@dataclass
class Roster:
    """The nodes that take part, their names, the ones left out, and the data agreement."""

    participants: list[int]
    names: dict[int, str]
    sources: dict[int, str] = field(default_factory=dict)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    rejected: list[dict[str, object]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    agreement: DataAgreement | None = None
    labels: dict[int, list[str]] = field(default_factory=dict)
    connected: list[int] = field(default_factory=list)  # every node asked at the identity round
    identities: dict[int, Identity] = field(default_factory=dict)  # the participants' answers
    rule: AgreementRule | None = None  # how the agreement was reached

    def present(self) -> dict[int, str]:
        """``{node id: name}`` of every node asked at the identity round (the name it
        reported where it answered)."""
        reported = {int(r["node_id"]): str(r["node_name"]) for r in self.rejected
                    if r.get("node_name")}
        return {n: self.names.get(n) or reported.get(n) or f"node {n}" for n in self.connected}

    def after_losing(self, lost: list[dict[str, object]]) -> Roster | None:
        """The roster of the participants that remain when ``lost`` (rejection entries of
        a protocol round) left, with the agreement those alone reach; None when no
        participant was lost or the agreement stays the same.

        A site that leaves after the identity round took part in the agreement (its
        feature sums in the scaling, its labels in the classes). The run's model must
        not depend on it, so the caller runs the rounds again with this roster: the
        same surviving sites then give the same model whenever the others left.
        """
        gone = {int(entry["node_id"]) for entry in lost} & set(self.participants)
        if not gone or self.rule is None:
            return None
        remaining = {n: self.identities[n] for n in self.participants if n not in gone}
        agreement, refused = agree(remaining, self.rule)
        if agreement is None or (not refused and self.agreement is not None and
                                 _same(agreement.to_config(), self.agreement.to_config())):
            return None
        kept = [n for n in self.participants if n in remaining and n not in refused]
        return Roster(
            participants=kept, names=self.names,  # the lost ones keep their names in reports
            sources={n: self.sources[n] for n in kept if n in self.sources},
            counts={n: self.counts[n] for n in kept if n in self.counts},
            rejected=self.rejected + [{"node_id": n, "node_name": remaining[n].name,
                                       "reason": why} for n, why in sorted(refused.items())],
            report=self.report, agreement=agreement,
            labels={n: self.labels[n] for n in kept if n in self.labels},
            connected=self.connected, identities={n: remaining[n] for n in kept}, rule=self.rule)

    def nodes_json(self, dropped: set[int] | None = None) -> list[dict[str, Any]]:
        """One entry per participating node, for the results file (``dropped``: nodes
        rejected in a later round, left out)."""
        dropped = dropped or set()
        notes = {n: i.notes for n, i in self.identities.items() if i.notes}
        return [{"node_id": int(n), "name": self.names[n], "data": self.sources.get(n, ""),
                 **self.counts.get(n, {}),
                 **({"labels": self.labels[n]} if n in self.labels else {}),
                 **({"notes": notes[n]} if n in notes else {})}
                for n in self.participants if n not in dropped]


def identify_nodes(grid: Grid, node_ids: list[int], exchange: Exchange,
                   rule: AgreementRule, registered: dict[int, str] | None = None) -> Roster:
    """Query ``node_ids`` (each gets ``exchange.node_config``); agree on features, classes
    and scaling (``rule``); keep the nodes that fit.

    For a named ``dataset`` the features and classes are that dataset's. For
    ``dataset='node-files'`` the number of features is ``num-features`` if set, else the
    count most nodes report; the classes are ``classes`` if set, else every class name
    the remaining nodes hold (sorted). Nodes that disagree are left out and named with
    their shapes. With ``standardize='federated'`` the nodes' per-feature sums are
    combined into one mean and std. ``registered``: ``{node id: name}`` of SuperNodes the
    operator registered by name (SuperNode authentication); that name is the site's, over
    the ``node-name`` the node reports.
    """
    t0 = time.perf_counter()
    accepted, rejected, traffic = _ask_identities(grid, node_ids, exchange)
    identities = {node_id: _registered_name(node_id, item[1], registered or {})
                  for node_id, item in accepted}
    for entry in rejected:
        name = (registered or {}).get(int(entry["node_id"]))
        if name:
            entry["node_name"] = name
    agreement, refused = agree(identities, rule)
    map_report = None
    if rule.map is not None and rule.map.round_asks and rule.map_round is not None \
            and rule.public_rows is None and agreement is not None:
        identities, lost, map_report = _map_round(
            grid, exchange, rule, agreement, identities, refused)
        rejected.extend(lost)
        accepted = [(n, item) for n, item in accepted if n in identities]
        agreement, refused = agree(identities, rule)
    for node_id, reason in refused.items():
        log(WARNING, "Identify: left out node %d ('%s'): %s", node_id,
            identities[node_id].name, reason)
        rejected.append({"node_id": node_id, "node_name": identities[node_id].name,
                         "reason": reason})
    roster = Roster(participants=[], names={}, rejected=rejected, agreement=agreement,
                    connected=[int(n) for n in node_ids], rule=rule)
    _add_participants(roster, [(n, identities[n]) for n, _ in accepted if n not in refused])
    if agreement is not None:
        _log_agreement(agreement, rule)
    roster.report = {**traffic, "wall_s": time.perf_counter() - t0}
    if map_report is not None:
        roster.report["map_round"] = map_report
        roster.report["bytes_sent"] += map_report["bytes_sent"]
        roster.report["bytes_received"] += map_report["bytes_received"]
    return roster


def _ask_identities(grid: Grid, node_ids: list[int], exchange: Exchange) -> tuple:
    """Send the identity query (the node config) to every node: ``(accepted, rejected,
    traffic)`` as :func:`validate_replies` sorts the replies (a malformed one is logged and
    rejected); ``traffic``: the round's ``bytes_sent`` and ``bytes_received``."""
    messages = round_messages(Round.IDENTIFY, wire.encode_config(exchange.node_config),
                              node_ids, group_id="identify", ttl=exchange.round_timeout)
    replies = list(grid.send_and_receive(messages, timeout=exchange.round_timeout))
    traffic = {"bytes_sent": sent_bytes(messages),
               "bytes_received": sum(wire.content_bytes(r.content) for r in replies
                                     if not r.has_error())}

    def check(reply_content):
        identity = decode_identity_full(reply_content)
        return identity.name, identity

    accepted, rejected = validate_replies(replies, node_ids, check, log_prefix="Identify: ",
                                          messages=messages)
    return accepted, rejected, traffic


def _add_participants(roster: Roster, kept: list[tuple[int, Identity]]) -> None:
    """Add the nodes ``kept`` to ``roster`` in name order, logging each (or a summary of
    many) and warning about names several nodes share."""
    duplicates = {name for name, k in Counter(i.name for _, i in kept).items() if k > 1}
    for node_id, identity in sorted(kept, key=lambda item: item[1].name):
        if identity.name in duplicates:
            log(WARNING, "Identify: several nodes call themselves '%s'; give each SuperNode "
                "its own node-name (node config) so results can tell them apart", identity.name)
        roster.participants.append(node_id)
        roster.names[node_id] = identity.name
        roster.sources[node_id] = identity.source
        roster.counts[node_id] = {**identity.counts,
                                  **({"num-test-examples": identity.num_test}
                                     if identity.num_test else {})}
        roster.labels[node_id] = identity.labels
        roster.identities[node_id] = identity
        if len(kept) <= MAX_NODES_NAMED:
            log(INFO, "Identify: node '%s' (id %d): %s, %d train / %d val%s", identity.name,
                node_id, identity.source, identity.counts["num-train-examples"],
                identity.counts["num-val-examples"],
                f" / {identity.num_test} test" if identity.num_test else "")
        for note in identity.notes:
            log(INFO, "Identify: node '%s': %s", identity.name, note)
    if len(kept) > MAX_NODES_NAMED:
        train = [i.counts["num-train-examples"] for _, i in kept]
        val = [i.counts["num-val-examples"] for _, i in kept]
        log(INFO, "Identify: %d nodes, %d-%d train and %d-%d val samples each (every node in "
            "results.json)", len(kept), min(train), max(train), min(val), max(val))


def _log_agreement(agreement: DataAgreement, rule: AgreementRule) -> None:
    """Log what the nodes agreed on: features, classes, scaling, column names."""
    log(INFO, "Identify: the run uses %d features and %d classes (%s)%s",
        agreement.num_features, agreement.num_classes, ", ".join(agreement.classes),
        ("" if agreement.mean is None else
         "; features scaled from the declared feature-ranges" if rule.standardize == Scaling.RANGES
         else "; features standardised with the nodes' combined mean and std"))
    if agreement.columns is not None:
        log(INFO, "Identify: sites' columns are matched by name (%s)",
            ", ".join(agreement.columns) if len(agreement.columns) <= 12
            else ", ".join(agreement.columns[:12]) + ", ...")


def _map_round(grid: Grid, exchange: Exchange, rule: AgreementRule,
               agreement: DataAgreement, identities: dict[int, Identity],
               refused: dict[int, str]):
    """The model's own round for its map: ask the nodes that fit for summaries of their
    rows (``rule.map_round``). Returns the identities (those that answered, with what they
    sent), the rejection entries of those that did not, and the round's report."""
    kept = {n: int(i.counts["num-train-examples"]) for n, i in identities.items() if n not in refused}
    if not kept:
        return identities, [], None
    sent, lost, report = collect_summaries(grid, exchange, agreement, rule.map_round, kept,
                                           rule.map.round_asks,
                                           {n: identities[n].name for n in identities})
    answered = {n: replace(i, summaries=sent[n]) if n in sent else i
                for n, i in identities.items() if n not in kept or n in sent}
    return answered, lost, report


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k]))
                                         for k in a)


def _names(identities: dict[int, Identity], nodes) -> str:
    return ", ".join(sorted(identities[n].name for n in nodes))


def _registered_name(node_id: int, identity: Identity, registered: dict[int, str]) -> Identity:
    """The identity under the name its SuperNode was registered with, if any: the operator
    gave that name, the node's own ``node-name`` is the site's word."""
    name = registered.get(node_id)
    if not name or name == identity.name:
        return identity
    log(WARNING, "Identify: node %d reports node-name '%s' but is registered as '%s'; the run "
        "calls it '%s'", node_id, identity.name, name, name)
    return replace(identity, name=name)


def agree(identities: dict[int, Identity], rule: AgreementRule
          ) -> tuple[DataAgreement | None, dict[int, str]]:
    """The run's :class:`DataAgreement` and ``{node id: reason}`` for the nodes left out
    (each check below adds its refusals in turn: sizes, feature counts and columns,
    labels, scaling, the feature map)."""
    refused: dict[int, str] = {}
    if not identities:
        return None, refused
    identities, categories = _complete_categories(identities)
    reported = {n: i.counts["num-features"] for n, i in identities.items()}
    num_features, classes, how = _agreed_shape(identities, reported, rule)
    if rule.dataset == NODE_FILES:  # own files only: a named dataset's division checks
        _refuse_small_sites(identities, rule.min_rows, refused)  # its own sizes
    columns = _refuse_feature_counts(identities, reported, num_features, how, rule, refused)
    if classes is None:
        classes = _agree_classes(identities, [n for n in identities if n not in refused],
                                 rule.classes)
    _refuse_unknown_labels(identities, classes, refused)
    mean, std = _agree_scaling(identities, refused, columns, rule, num_features)
    features = None
    if rule.map is not None:
        features = _agreed_map(identities, refused, columns, rule,
                               DataAgreement(num_features, classes, mean, std, columns, None))
    return DataAgreement(num_features, classes, mean, std, columns, features,
                         {b: v for b, v in categories.items()
                          if any(base_of(c, [b]) for c in columns or [])} or None), refused


def _agreed_shape(identities: dict[int, Identity], reported: dict[int, int],
                  rule: AgreementRule) -> tuple[int, list[str] | None, str]:
    """``(number of features, classes or None where the nodes' labels decide, how the
    count was chosen)``: the named dataset's, the ``num-features`` setting, or the count
    most nodes report (ties: most rows, then fewer features)."""
    if rule.dataset != NODE_FILES:
        num_features, count = DATASET_SHAPES[rule.dataset]
        return num_features, [str(i) for i in range(count)], f"the run's dataset '{rule.dataset}'"
    if rule.num_features:
        return rule.num_features, None, "num-features setting"
    votes = Counter(reported.values())
    rows = lambda f: sum(identities[n].counts["num-train-examples"]
                         for n, v in reported.items() if v == f)
    num_features = max(votes, key=lambda f: (votes[f], rows(f), -f))
    holders = [n for n, v in reported.items() if v == num_features]
    return num_features, None, (f"held by {len(holders)} of {len(reported)} nodes: "
                                f"{_names(identities, holders)}")


def _refuse_small_sites(identities: dict[int, Identity], min_rows: int,
                        refused: dict[int, str]) -> None:
    for node_id, identity in identities.items():
        held = int(identity.counts["num-train-examples"])
        if held < min_rows:
            refused[node_id] = (f"node '{identity.name}' holds {held} training row(s); the run "
                                f"needs at least {min_rows} (min-rows) to train and check "
                                "a model there")


def _refuse_feature_counts(identities: dict[int, Identity], reported: dict[int, int],
                           num_features: int, how: str, rule: AgreementRule,
                           refused: dict[int, str]) -> list[str] | None:
    """Refuse the nodes whose feature count differs from the run's; the run's column names
    where the sites' files carry them (matched by name first: a refusal names the columns)."""
    by_name = rule.dataset == NODE_FILES and any(i.columns is not None for i in identities.values())
    for node_id, features in reported.items():
        if node_id in refused or (by_name and identities[node_id].columns is not None):
            continue
        if features != num_features:
            refused[node_id] = (f"node '{identities[node_id].name}' holds data with {features} "
                                f"features; the run has {num_features} ({how})")
    if rule.dataset != NODE_FILES:
        return None
    columns = _agree_columns(identities, [n for n in identities if n not in refused], refused)
    for node_id, features in reported.items():  # names that matched, counts that do not
        if node_id not in refused and features != (len(columns) if columns else num_features):
            refused[node_id] = (f"node '{identities[node_id].name}' holds data with "
                                f"{features} features; the run has {num_features} ({how})")
    return columns


def _refuse_unknown_labels(identities: dict[int, Identity], classes: list[str],
                           refused: dict[int, str]) -> None:
    for node_id in [n for n in identities if n not in refused]:
        unknown = sorted(set(identities[node_id].labels) - set(classes))
        if unknown:
            refused[node_id] = (f"node '{identities[node_id].name}' holds label(s) "
                                f"{', '.join(unknown)} that are not among the run's classes "
                                f"({', '.join(classes)})")


def _agree_scaling(identities: dict[int, Identity], refused: dict[int, str],
                   columns: list[str] | None, rule: AgreementRule, num_features: int):
    """The features' ``(mean, std)``: the nodes' combined sums (``standardize='federated'``;
    a node that sent none is refused), the declared ranges, or ``(None, None)``."""
    if rule.standardize == Scaling.FEDERATED:
        for node_id in [n for n in identities if n not in refused]:
            if identities[node_id].stats is None:
                refused[node_id] = (f"node '{identities[node_id].name}' sent no feature sums for "
                                    "standardize='federated'")
        kept = sorted((n for n in identities if n not in refused),
                      key=lambda n: (identities[n].name, n))  # one order, however they came
        stats = [_in_order(identities[n], columns) for n in kept]
        if stats:
            return combine_stats(stats)
    elif rule.standardize == Scaling.RANGES and rule.ranges is not None:
        return rule.ranges.scaling(columns, num_features)
    return None, None


def _pick(values: np.ndarray, source: list[int | None]) -> np.ndarray:
    """``values`` at ``source``, 0 where the source is None (a value the site lacks)."""
    return np.array([0.0 if i is None else values[i] for i in source])


def _complete_categories(identities: dict[int, Identity]
                         ) -> tuple[dict[int, Identity], dict[str, list[str]]]:
    """Every site's category columns with every value some site holds (a site has zeros,
    and zero sums, where it lacks a value), and those values per column. Nothing changes
    where no site has a category column."""
    if not any(i.categories for i in identities.values()):
        return identities, {}
    levels = agreed_levels((i.columns or [], i.categories) for i in identities.values())
    out = {}
    for node_id, identity in identities.items():
        if not identity.categories or identity.columns is None:
            out[node_id] = identity
            continue
        names, source = complete_columns(identity.columns, identity.categories, levels)
        stats = identity.stats
        if stats is not None:
            count, total, squares = stats
            stats = (count, _pick(total, source), _pick(squares, source))
        out[node_id] = replace(identity, columns=names, stats=stats,
                               counts={**identity.counts, "num-features": len(names)})
    return out, levels


def _agreed_map(identities: dict[int, Identity], refused: dict[int, str],
                columns: list[str] | None, rule: AgreementRule, shape: DataAgreement
                ) -> FeatureMap | None:
    """The model's map, as its rule builds it from what the nodes that fit said (in name
    order, their feature sums in the run's column order); ``shape``: the agreement so far."""
    kept = sorted((n for n in identities if n not in refused),
                  key=lambda n: (identities[n].name, n))
    nodes = tuple(NodeEvidence(None if identities[n].stats is None
                               else _in_order(identities[n], columns), identities[n].summaries)
                  for n in kept)
    public = None if rule.public_rows is None else partial(rule.public_rows, shape)
    evidence = MapEvidence(shape.num_features, nodes, shape.mean, shape.std,
                           rule.standardize == Scaling.NODE, public)
    features, note = rule.map.agree(evidence)
    if note:
        log(INFO, "Identify: %s", note)
    return features


def _agree_columns(identities: dict[int, Identity], nodes: list[int],
                   refused: dict[int, str]) -> list[str] | None:
    """The run's feature columns by name (None: no node has a header; matched by position).

    The set of names most nodes hold wins (ties: more training rows, then the names);
    its order is that of the first such node by name, so the order of arrival never
    matters. Nodes whose names differ are added to ``refused`` with the difference;
    nodes without names are matched by position.
    """
    named = {n: identities[n].columns for n in nodes if identities[n].columns is not None}
    if not named:
        return None
    key = {n: f"{identities[n].name}\0{n}" for n in named}  # by name, then id: one order
    node_of = {k: n for n, k in key.items()}
    columns, holding = vote_columns({key[n]: c for n, c in named.items()},
                                    {key[n]: identities[n].counts["num-train-examples"] for n in named})
    holders = [node_of[k] for k in holding]
    how = f"held by {len(holders)} of {len(named)} nodes with a header: {_names(identities, holders)}"
    for node_id, held in named.items():
        problem = column_difference(held, columns, "the run")
        if problem:
            refused[node_id] = f"node '{identities[node_id].name}' {problem} ({how})"
    return columns


def _in_order(identity: Identity, columns: list[str] | None) -> tuple[int, np.ndarray, np.ndarray]:
    """A node's feature sums in the run's column order."""
    count, total, squares = identity.stats
    if columns is None or identity.columns is None:
        return count, total, squares
    order = [identity.columns.index(c) for c in columns]
    return count, total[order], squares[order]


def _agree_classes(identities: dict[int, Identity], nodes: list[int],
                   classes: str) -> list[str]:
    """``classes`` if it lists names; else the class names the nodes hold (with a count:
    ``0..N-1`` for integer labels, otherwise the N names held by most nodes)."""
    pinned = parse_classes(classes)
    if isinstance(pinned, list):
        return pinned
    held = Counter(label for n in nodes for label in set(identities[n].labels))
    if pinned is None:
        return sort_classes(held)
    if all(label.lstrip("-").isdigit() for label in held):
        return [str(i) for i in range(pinned)]
    common = sorted(held, key=lambda label: (-held[label], label))[:pinned]
    return sort_classes(common)
