"""Settings of operating a run: its seed, which replies and sites it needs, how long
it waits, and where results go.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gems_fl.settings.checks import at_least, non_empty, one_of, positive, setting
from gems_fl.settings.values import parse_min_good_enough, parse_required_nodes


class Baselines(StrEnum):
    """What ``baselines`` may say, from the fewest comparison rows to the paper's full
    table (the setting stays its text, which compares equal to its member)."""

    NONE = "none"
    CHEAP = "cheap"
    ALL = "all"


BASELINES = tuple(b.value for b in Baselines)
PROFILES = ("product", "paper")
#: what ``profile='paper'`` sets, wherever the setting holds its product default: the
#: paper's spaces, ellipsoid floor, neuron criterion and fine-tuning, and its full table
PAPER_PROFILE = {"space": "ellipsoid", "ellipsoid-floor": "paper", "neuron-criterion": "paper",
                 "tune-stop": "fixed", "tune-layers": "last", "tune-fresh": False,
                 "baselines": "all", "local-solve": "adam"}


@dataclass(frozen=True)
class OperationSettings:
    """How a run is operated."""

    seed: int = setting(
        0,
        'seeds splits, partitions, initialisation, directions, public sample',
        at_least(0), node=True, user=True)
    min_replies: int = setting(
        2,
        'fewer valid replies than this stops the run with an error',
        positive, user=True)
    required_nodes: str = setting(
        'all',
        'which sites must take part to the end, else the run exits non-zero (results are '
        'still written, status `incomplete`): `all` (every node present at the identity '
        'round), a count (`0`: none), or node names (`site-a,site-b`)',
        lambda key, value: parse_required_nodes(value), user=True)
    min_good_enough: str = setting(
        'majority',
        'how many sites must find h_G good enough (its accuracy on their validation rows >= '
        'their eps), else the run exits 4 (results still written, status '
        '`not-good-enough`): `majority` (more than half of the sites that took part), or a '
        'count (`0`: no check)',
        lambda key, value: parse_min_good_enough(value), user=True)
    site_wait: float = setting(
        60.0,
        'seconds the server waits, before the identity round, for the sites it expects '
        '(`required-nodes`: a count, or as many nodes as it names; else `min-replies`); a '
        'required site still missing or rejected then stops the run before any training '
        '(exit 3, each site named with the reason)',
        positive)
    round_timeout: float = setting(
        1800.0,
        "seconds the server waits for the replies of one round; also each message's TTL, "
        'so work for a slow or dead node is dropped, not left queued',
        positive, user=True)
    evaluate_on_server: bool = setting(
        True,
        'the server loads the dataset for its test set (and, with `baselines=\'all\'`, '
        'Global and Raw); set `false` where '
        'it holds no data', user=True)
    baselines: str = setting(
        'cheap',
        'comparison rows on the server\'s test set: `cheap` (GEMS, Local, Averaged, and the '
        'MLP\'s Ensemble: no training on the server), `none` (GEMS only), `all` (also the '
        'paper\'s Global, GEMS tuned, Raw and Raw converged, which train on the server; '
        '`gems-fl reproduce` uses it)',
        one_of(BASELINES), user=True)
    profile: str = setting(
        'product',
        '`product` (the defaults measured best here) or `paper`: the paper\'s recipe for every '
        'setting still at its product default (' + ', '.join(f'`{k}={v}`'.replace('False', 'false')
                                                          for k, v in PAPER_PROFILE.items()) + ')',
        one_of(PROFILES), lab=True)
    output_dir: str = setting(
        'gems-results',
        'results go to `<output-dir>/run-<run id>/`',
        non_empty("output-dir must name a folder, e.g. 'gems-results'"), user=True)
