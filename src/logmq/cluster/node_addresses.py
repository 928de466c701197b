"""``ID@HOST:PORT`` lists: the quorum's voters (``--quorum-voters``) and the peers' addresses
(``--peer-addresses``), parsed once for the configuration's checks and the quorum."""

from __future__ import annotations

Address = tuple[str, int]


def parse_voters(text: str) -> dict[int, Address]:
    """``1@host:port,2@host:port`` -> {1: (host, port), ...}; ValueError names the problem."""
    return parse_node_addresses(text, "quorum voter", "--quorum-voters")


def parse_node_addresses(text: str, what: str, option: str) -> dict[int, Address]:
    """``ID@HOST:PORT,...`` -> {id: (host, port)}, for voters and ``--peer-addresses``."""
    nodes: dict[int, Address] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        node, sep, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not host:
            raise ValueError(f"{what} {item!r} is not ID@HOST:PORT")
        try:
            node_id, port_no = int(node), int(port)
        except ValueError:
            raise ValueError(f"{what} {item!r}: id and port must be numbers") from None
        if node_id < 0 or not 0 < port_no < 65536:
            raise ValueError(f"{what} {item!r}: bad id or port")
        if node_id in nodes:
            raise ValueError(f"{what} {node_id} is listed twice")
        nodes[node_id] = (host, port_no)
    if not nodes:
        raise ValueError(f"{option} lists no node")
    return nodes
