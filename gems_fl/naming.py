"""How logs and printed tables name nodes: by id and stable name, or by count when there
are many (``results.json`` always names every node). Plain Python, no Flower."""

from __future__ import annotations

from collections.abc import Mapping


def describe_node(node_id: int, names: Mapping[int, str]) -> str:
    """``123 ('site-a')`` if the node's name is known, else its id."""
    return f"{node_id} ('{names[node_id]}')" if node_id in names else str(node_id)


# Above this many nodes log lines and printed tables count or summarise the nodes instead
# of naming each one (results.json names every node; rejected nodes are always named).
MAX_NODES_NAMED = 10


def describe_nodes(node_ids: list[int], names: Mapping[int, str]) -> str:
    """Each node described, or a count when there are more than ``MAX_NODES_NAMED``."""
    if not node_ids:
        return "none"
    if len(node_ids) > MAX_NODES_NAMED:
        return f"{len(node_ids)} nodes (named in results.json)"
    return ", ".join(describe_node(n, names) for n in node_ids)
