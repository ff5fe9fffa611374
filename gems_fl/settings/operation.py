"""Settings of operating a run: its seed, which replies and sites it needs, how long
it waits, and where results go.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.settings.checks import at_least, non_empty, positive, setting
from gems_fl.settings.values import parse_required_nodes


@dataclass(frozen=True)
class OperationSettings:
    """How a run is operated."""

    seed: int = setting(
        0,
        'seeds splits, partitions, initialisation, directions, public sample',
        at_least(0), node=True)
    min_replies: int = setting(
        2,
        'fewer valid replies than this stops the run with an error',
        positive)
    required_nodes: str = setting(
        'all',
        'which sites must take part to the end, else the run exits non-zero (results are '
        'still written, status `incomplete`): `all` (every node present at the identity '
        'round), a count (`0`: none), or node names (`site-a,site-b`)',
        lambda key, value: parse_required_nodes(value))
    round_timeout: float = setting(
        1800.0,
        "seconds the server waits for the replies of one round; also each message's TTL, "
        'so work for a slow or dead node is dropped, not left queued',
        positive)
    evaluate_on_server: bool = setting(
        True,
        'the server loads the dataset for Global, Raw and the test set; set `false` where '
        'it holds no data')
    output_dir: str = setting(
        'gems-results',
        'results go to `<output-dir>/run-<run id>/`',
        non_empty("output-dir must name a folder, e.g. 'gems-results'"))
