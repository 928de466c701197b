"""Who a data directory belongs to: ``meta.properties`` checked against the quorum.

A data dir holds one node's logs for one cluster. Serving it under another node id (two
brokers pointed at the same directory, or a copied one) or inside another cluster (a
directory from an old cluster, a broker joining the wrong quorum) would silently mix
replicas that have nothing in common, so both are refused with a message that says what
to fix. The cluster id is chosen once by the first controller (ClusterIdRecord in the
metadata log); a directory that has never seen one adopts it on first contact.

This module is the one home of the file: its format (``key=value`` lines: node id,
cluster id, format version), the check at start (``check_node_id``) and the checks
against the quorum. It also reads a file written before the cluster id was known
(``node.id`` alone). Writes go through ``atomic_write`` (temp file, fsync, rename, fsync
the directory), so a crash leaves the old file or the new one, never a torn one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from logmq.errors import ErrorCode, LogMQError
from logmq.storage.checkpoint import atomic_write

META_PROPERTIES = "meta.properties"
FORMAT_VERSION = 1


class ClusterIdentityError(LogMQError):
    """The data directory belongs to another node or another cluster."""

    code = ErrorCode.INCONSISTENT_CLUSTER_ID


class NodeIdMismatchError(ClusterIdentityError):
    """The data dir belongs to another node id (or a newer format): serving it would
    corrupt a cluster."""


@dataclass(frozen=True, slots=True)
class MetaProperties:
    node_id: int
    cluster_id: str
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        return (
            "# logmq broker identity; do not edit\n"
            f"node.id={self.node_id}\n"
            f"cluster.id={self.cluster_id}\n"
            f"format.version={self.format_version}\n"
        ).encode()


def parse_properties(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def read_properties(path: Path) -> dict[str, str]:
    return parse_properties(path.read_text())


def check_node_id(data_dir: str | Path, node_id: int) -> None:
    """At start: refuse a data dir whose meta.properties names another node, or a format
    newer than this broker reads."""
    path = Path(data_dir) / META_PROPERTIES
    if not path.exists():
        return
    recorded, _ = read_identity(data_dir)
    if recorded is not None and recorded != node_id:
        raise NodeIdMismatchError(
            f"{path} says node.id={recorded} but the broker was started with "
            f"--node-id {node_id}; use the matching node id or another data dir"
        )
    version = read_properties(path).get("format.version", str(FORMAT_VERSION))
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise NodeIdMismatchError(
            f"{path} has format.version={version}; this broker reads up to {FORMAT_VERSION}"
        )


def read_identity(data_dir: str | Path) -> tuple[int | None, str | None]:
    """(node id, cluster id) recorded in ``data_dir``; None for what is not recorded."""
    path = Path(data_dir) / META_PROPERTIES
    if not path.exists():
        return None, None
    values = read_properties(path)
    try:
        node = int(values["node.id"]) if "node.id" in values else None
    except ValueError:
        raise ClusterIdentityError(f"{path}: node.id {values['node.id']!r} is not a number")
    return node, values.get("cluster.id") or None


def check_meta_properties(
    data_dir: str | Path, node_id: int, cluster_id: str | None
) -> MetaProperties | None:
    """Refuse a data dir of another node or cluster; record the cluster id once known.

    ``cluster_id`` is the quorum's (None while it has not been learned yet: then only the
    node id is checked). Returns what is now recorded (None if nothing is yet).
    """
    data_dir = Path(data_dir)
    path = data_dir / META_PROPERTIES
    recorded_node, recorded_cluster = read_identity(data_dir)
    if recorded_node is not None and recorded_node != node_id:
        raise ClusterIdentityError(
            f"{path} says node.id={recorded_node} but this broker is node {node_id}: "
            "each broker needs its own data directory"
        )
    if recorded_cluster is not None and cluster_id is not None and recorded_cluster != cluster_id:
        raise ClusterIdentityError(
            f"{path} belongs to cluster {recorded_cluster} but the quorum is cluster "
            f"{cluster_id}: this directory holds another cluster's data; use an empty "
            "data directory or the right --quorum-voters"
        )
    if recorded_cluster is None and cluster_id is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        meta = MetaProperties(node_id, cluster_id, FORMAT_VERSION)
        atomic_write(path, meta.encode())
        return meta
    if recorded_cluster is None:
        return None
    return MetaProperties(node_id, recorded_cluster, FORMAT_VERSION)
