"""The APIs the broker serves: versions, the handler of each key, and how each is scheduled.

One table a newcomer can read to see what a request key does on the broker: which
handler answers it, whether the controller must run it, whether it needs the offsets
topic first, and whether the connection may run it concurrently or skip it once its
client has gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from logmq.net.codec import ApiKey, Request
from logmq.net.reply import Reply

if TYPE_CHECKING:
    from logmq.native.admin_api import AdminApi
    from logmq.native.cluster_api import ClusterApi
    from logmq.native.data_api import DataApi
    from logmq.native.group_api import GroupApi
    from logmq.native.reassignment_api import ReassignmentApi
    from logmq.native.security_api import SecurityApi
    from logmq.native.txn_api import TxnApi

Handler = Callable[[Request], Awaitable[Reply | None]]

# api key -> (min version, max version)
SUPPORTED_APIS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (0, 0),
    ApiKey.FETCH: (0, 0),
    ApiKey.LIST_OFFSETS: (0, 0),
    ApiKey.DELETE_RECORDS: (0, 0),
    ApiKey.METADATA: (0, 0),
    ApiKey.API_VERSIONS: (0, 0),
    ApiKey.SASL_HANDSHAKE: (0, 0),
    ApiKey.SASL_AUTHENTICATE: (0, 0),
    ApiKey.CREATE_TOPICS: (0, 0),
    ApiKey.DELETE_TOPICS: (0, 0),
    ApiKey.INIT_PRODUCER_ID: (0, 0),
    ApiKey.DESCRIBE_CONFIGS: (0, 0),
    ApiKey.ALTER_CONFIGS: (0, 0),
    ApiKey.CREATE_PARTITIONS: (0, 0),
    ApiKey.FIND_COORDINATOR: (0, 0),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (0, 0),
    ApiKey.OFFSET_COMMIT: (0, 0),
    ApiKey.OFFSET_FETCH: (0, 0),
    ApiKey.LIST_GROUPS: (0, 0),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (0, 0),
    ApiKey.DELETE_GROUPS: (0, 0),
    ApiKey.OFFSET_DELETE: (0, 0),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (0, 0),
    ApiKey.DESCRIBE_CLUSTER: (0, 0),
    ApiKey.DESCRIBE_QUORUM: (0, 0),
    ApiKey.BROKER_REGISTRATION: (0, 0),
    ApiKey.BROKER_HEARTBEAT: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
    ApiKey.WRITE_TXN_MARKERS: (0, 0),  # broker -> broker (native/txn_api.py)
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 0),  # a producer's; verify_only: broker -> broker
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 0),  # native/txn_api.py
    ApiKey.END_TXN: (0, 0),  # native/txn_api.py
    ApiKey.TXN_OFFSET_COMMIT: (0, 0),  # native/group_api.py
    ApiKey.DESCRIBE_PRODUCERS: (0, 0),  # native/txn_api.py (operations tools)
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 0),
    ApiKey.ALTER_PARTITION: (0, 0),
    ApiKey.DESCRIBE_LOG_DIRS: (0, 0),
    ApiKey.ELECT_LEADERS: (0, 0),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    ApiKey.DESCRIBE_ACLS: (0, 0),
    ApiKey.CREATE_ACLS: (0, 0),
    ApiKey.DELETE_ACLS: (0, 0),
    ApiKey.DESCRIBE_CLIENT_QUOTAS: (0, 0),
    ApiKey.ALTER_CLIENT_QUOTAS: (0, 0),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: (0, 0),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: (0, 0),
}

# metadata changes: run by the controller; other brokers forward them to it
CONTROLLER_APIS = frozenset(
    {
        ApiKey.CREATE_TOPICS,
        ApiKey.DELETE_TOPICS,
        ApiKey.ALTER_CONFIGS,
        ApiKey.CREATE_PARTITIONS,
        ApiKey.ELECT_LEADERS,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        ApiKey.CREATE_ACLS,
        ApiKey.DELETE_ACLS,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS,
        ApiKey.ALTER_CLIENT_QUOTAS,
    }
)
# group requests need __consumer_offsets: the first one creates it
GROUP_APIS = frozenset(
    {
        ApiKey.FIND_COORDINATOR,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
        ApiKey.OFFSET_COMMIT,
        ApiKey.TXN_OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.LIST_GROUPS,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        ApiKey.DELETE_GROUPS,
        ApiKey.OFFSET_DELETE,
    }
)

# requests without side effects: skipped when their client has already gone away
# (not Metadata: it may auto-create topics)
READ_ONLY_APIS = frozenset(
    {
        ApiKey.FETCH,
        ApiKey.LIST_OFFSETS,
        ApiKey.API_VERSIONS,
        ApiKey.DESCRIBE_CONFIGS,
        ApiKey.OFFSET_FETCH,
        ApiKey.LIST_GROUPS,
        ApiKey.CONSUMER_GROUP_DESCRIBE,
        ApiKey.DESCRIBE_CLUSTER,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.DESCRIBE_LOG_DIRS,
        ApiKey.LIST_PARTITION_REASSIGNMENTS,
        ApiKey.DESCRIBE_ACLS,
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS,
        ApiKey.DESCRIBE_CLIENT_QUOTAS,
        ApiKey.DESCRIBE_PRODUCERS,
        ApiKey.DESCRIBE_TRANSACTIONS,
        ApiKey.LIST_TRANSACTIONS,
    }
)

# requests that may start while earlier ones of their connection still run: they wait
# on durability (fsync), and each enqueues its work before its first await, so they
# still take effect in arrival order (see DataApi.produce and group_api)
CONCURRENT_APIS = frozenset(
    {
        ApiKey.PRODUCE,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.CONSUMER_GROUP_HEARTBEAT,
    }
)


def handler_table(
    admin: AdminApi,
    data: DataApi,
    group_api: GroupApi,
    cluster_api: ClusterApi,
    reassignment_api: ReassignmentApi,
    security_api: SecurityApi | None = None,
    txn_api: TxnApi | None = None,
) -> dict[int, Handler]:
    """api key -> the method of the native API objects that answers it.

    ``security_api`` defaults to one over the admin API's quorum and metrics; without
    ``txn_api`` the transaction APIs are left out (the caller adds them)."""
    if security_api is None:
        from logmq.native.security_api import SecurityApi

        security_api = SecurityApi(admin.quorum, admin.metrics)
    txn: dict[int, Handler] = {}
    if txn_api is not None:
        txn = {
            ApiKey.ADD_PARTITIONS_TO_TXN: txn_api.add_partitions_to_txn,
            ApiKey.ADD_OFFSETS_TO_TXN: txn_api.add_offsets_to_txn,
            ApiKey.END_TXN: txn_api.end_txn,
            ApiKey.WRITE_TXN_MARKERS: txn_api.write_txn_markers,
            ApiKey.DESCRIBE_TRANSACTIONS: txn_api.describe_transactions,
            ApiKey.LIST_TRANSACTIONS: txn_api.list_transactions,
            ApiKey.DESCRIBE_PRODUCERS: txn_api.describe_producers,
        }
    return txn | {
        ApiKey.API_VERSIONS: admin.api_versions,
        ApiKey.METADATA: admin.metadata,
        ApiKey.CREATE_TOPICS: admin.create_topics,
        ApiKey.DELETE_TOPICS: admin.delete_topics,
        ApiKey.DESCRIBE_CONFIGS: admin.describe_configs,
        ApiKey.ALTER_CONFIGS: admin.alter_configs,
        ApiKey.CREATE_PARTITIONS: admin.create_partitions,
        ApiKey.INIT_PRODUCER_ID: admin.init_producer_id,
        ApiKey.PRODUCE: data.produce,
        ApiKey.FETCH: data.fetch,
        ApiKey.LIST_OFFSETS: data.list_offsets,
        ApiKey.DELETE_RECORDS: data.delete_records,
        ApiKey.FIND_COORDINATOR: group_api.find_coordinator,
        ApiKey.CONSUMER_GROUP_HEARTBEAT: group_api.consumer_group_heartbeat,
        ApiKey.OFFSET_COMMIT: group_api.offset_commit,
        ApiKey.TXN_OFFSET_COMMIT: group_api.txn_offset_commit,
        ApiKey.OFFSET_FETCH: group_api.offset_fetch,
        ApiKey.LIST_GROUPS: group_api.list_groups,
        ApiKey.CONSUMER_GROUP_DESCRIBE: group_api.consumer_group_describe,
        ApiKey.DELETE_GROUPS: group_api.delete_groups,
        ApiKey.OFFSET_DELETE: group_api.offset_delete,
        ApiKey.OFFSET_FOR_LEADER_EPOCH: data.offsets_for_leader_epoch,
        ApiKey.DESCRIBE_CLUSTER: cluster_api.describe_cluster,
        ApiKey.DESCRIBE_QUORUM: cluster_api.describe_quorum,
        ApiKey.BROKER_REGISTRATION: cluster_api.broker_registration,
        ApiKey.BROKER_HEARTBEAT: cluster_api.broker_heartbeat,
        ApiKey.ALLOCATE_PRODUCER_IDS: cluster_api.allocate_producer_ids,
        ApiKey.ALTER_PARTITION: cluster_api.alter_partition,
        ApiKey.DESCRIBE_LOG_DIRS: reassignment_api.describe_log_dirs,
        ApiKey.ELECT_LEADERS: reassignment_api.elect_leaders,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS: reassignment_api.alter_partition_reassignments,
        ApiKey.LIST_PARTITION_REASSIGNMENTS: reassignment_api.list_partition_reassignments,
        ApiKey.DESCRIBE_ACLS: security_api.describe_acls,
        ApiKey.CREATE_ACLS: security_api.create_acls,
        ApiKey.DELETE_ACLS: security_api.delete_acls,
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: security_api.describe_user_scram_credentials,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS: security_api.alter_user_scram_credentials,
        ApiKey.DESCRIBE_CLIENT_QUOTAS: security_api.describe_client_quotas,
        ApiKey.ALTER_CLIENT_QUOTAS: security_api.alter_client_quotas,
    }
