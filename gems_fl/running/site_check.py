"""``gems-fl run --site``: the identity round, done on the site files before anything starts.

Each file is read as its simulated node will read it, described as that node will
describe itself, and put through the server's own agreement (features, column names,
classes, ``min-rows``). If the run would then stop before training (a site that
``required-nodes`` requires is left out), the command stops here, in seconds, with the
same reasons; sites that ``required-nodes`` lets go are named as a warning.
"""

from __future__ import annotations

from gems_fl.data.nodes import NodeDataError, load_node_data, node_name, own_node_config
from gems_fl.protocol.attendance import missing_before_training
from gems_fl.protocol.identity_replies import decode_identity_full
from gems_fl.protocol.node import identity_content
from gems_fl.protocol.replies import ReplyError
from gems_fl.protocol.roster import agree
from gems_fl.settings import Settings
from gems_fl.settings.options import agreement_rule, node_data_options
from gems_fl.settings.values import parse_required_nodes


class SitesDoNotFit(ValueError):
    """A required site's file would be left out at the identity round."""


def check_sites(settings: Settings) -> list[str]:
    """The sites (``settings.site_files``) put through the identity round's checks.

    Returns one line per site that would be left out although ``required-nodes`` allows
    it; raises :class:`SitesDoNotFit` naming each site and why when the run would stop
    before training.
    """
    files = [f for f in settings.site_files.split(",") if f]
    identities, rejected, present = {}, [], {}
    for k in range(len(files)):
        config = own_node_config({"partition-id": k, "num-partitions": len(files)},
                                 settings.site_files)
        name = present[k] = node_name(config)
        try:
            data = load_node_data(node_data_options(settings), config)
            content = identity_content(data, with_stats=settings.identity_sums)
            identities[k] = decode_identity_full(content)
        except (NodeDataError, ReplyError) as exc:
            rejected.append({"node_id": k, "node_name": name, "reason": str(exc)})
    _, refused = agree(identities, agreement_rule(settings))
    rejected += [{"node_id": k, "node_name": present[k], "reason": why}
                 for k, why in sorted(refused.items())]
    taking_part = [k for k in identities if k not in refused]
    wanted = parse_required_nodes(settings.required_nodes)
    missing = missing_before_training(present, taking_part, present, rejected, wanted, 0.0)
    if missing:
        # each reason whole, on its own line: it says what to change in the file
        lines = "\n".join(f"  {name}: {why.removeprefix('rejected: ')}" for name, why in missing)
        others = ("; or, to run without them, set required-nodes to a count or the names of "
                  "the sites that fit" if len(taking_part) >= settings.min_replies else "")
        raise SitesDoNotFit(
            f"--site: the run would stop before training (required-nodes="
            f"{settings.required_nodes!r}; checked on the files, nothing was started):\n"
            f"{lines}\nfix the file(s) (`gems-fl check-data FILE ...` shows each problem){others}")
    return [f"--site: {r['node_name']} will be left out: {r['reason']}" for r in rejected]
