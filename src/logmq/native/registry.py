"""Every API the native listener serves, one entry each: versions, handler, ACL, scheduling.

The native door's ApiVersions answer, the pipeline's steps (authentication,
authorization, the offsets topic, forwarding to the controller, the request-time quota)
and the connection's scheduling read this table, so it is the one place to add an API
(net/api_registry.py says what each field means). Every native API is at version 0: its
msgpack bodies grow by optional keys, never by a new version (docs/protocol.md).
Concurrent APIs wait on durability (fsync) and enqueue their work before their first
await, so they still take effect in arrival order (DataApi.produce, native/group_api.py).
"""

from __future__ import annotations

from logmq.native.admin_api import AdminApi
from logmq.native.authorization import (
    ADD_OFFSETS,
    ADD_PARTITIONS,
    DELETE_TOPICS,
    END_TXN,
    FIND_COORDINATOR,
    OFFSET_COMMIT,
    TXN_OFFSET_COMMIT,
    BrokersOnly,
    InHandler,
    ProducerIdAccess,
    Unchecked,
    cluster,
    configs,
    group,
    topics,
)
from logmq.native.cluster_api import ClusterApi
from logmq.native.data_api import DataApi
from logmq.native.group_api import GroupApi
from logmq.native.reassignment_api import ReassignmentApi
from logmq.native.remote_tier_api import RemoteTierApi
from logmq.native.sasl_api import NativeSaslApi
from logmq.native.security_api import SecurityApi
from logmq.native.txn_api import TxnApi
from logmq.net.api_registry import ApiRegistry, ApiSpec
from logmq.net.codec import ApiKey as K
from logmq.security.acl import AclOperation as Op

V0 = (0, 0)

NATIVE_APIS = ApiRegistry(
    "native",
    [
        ApiSpec(K.PRODUCE, V0, DataApi.produce, topics(Op.WRITE), concurrent=True),
        ApiSpec(K.FETCH, V0, DataApi.fetch, topics(Op.READ), read_only=True),
        ApiSpec(K.LIST_OFFSETS, V0, DataApi.list_offsets, topics(Op.DESCRIBE), read_only=True),
        ApiSpec(
            K.OFFSET_FOR_LEADER_EPOCH,
            V0,
            DataApi.offsets_for_leader_epoch,
            topics(Op.DESCRIBE, brokers_too=True),
        ),
        ApiSpec(K.DELETE_RECORDS, V0, DataApi.delete_records, topics(Op.DELETE)),
        ApiSpec(
            K.METADATA,
            V0,
            AdminApi.metadata,
            InHandler("DESCRIBE on each topic: a listing shows only those; CREATE to auto-create"),
        ),
        ApiSpec(
            K.API_VERSIONS,
            V0,
            AdminApi.api_versions,
            Unchecked("what a client asks before it logs in"),
            read_only=True,
            before_auth=True,
        ),
        ApiSpec(
            K.SASL_HANDSHAKE,
            V0,
            NativeSaslApi.sasl_handshake,
            Unchecked("the login itself"),
            before_auth=True,
            throttled=False,
        ),
        ApiSpec(
            K.SASL_AUTHENTICATE,
            V0,
            NativeSaslApi.sasl_authenticate,
            Unchecked("the login itself"),
            before_auth=True,
            throttled=False,
        ),
        ApiSpec(
            K.CREATE_TOPICS,
            V0,
            AdminApi.create_topics,
            topics(Op.CREATE, create_on_cluster=True),
            controller=True,
        ),
        ApiSpec(K.DELETE_TOPICS, V0, AdminApi.delete_topics, DELETE_TOPICS, controller=True),
        ApiSpec(
            K.CREATE_PARTITIONS, V0, AdminApi.create_partitions, topics(Op.ALTER), controller=True
        ),
        ApiSpec(
            K.DESCRIBE_CONFIGS,
            V0,
            AdminApi.describe_configs,
            InHandler("DESCRIBE_CONFIGS on each topic, or on the cluster for a broker"),
            read_only=True,
        ),
        ApiSpec(
            K.ALTER_CONFIGS, V0, AdminApi.alter_configs, configs(Op.ALTER_CONFIGS), controller=True
        ),
        ApiSpec(K.INIT_PRODUCER_ID, V0, AdminApi.init_producer_id, ProducerIdAccess()),
        ApiSpec(
            K.FIND_COORDINATOR, V0, GroupApi.find_coordinator, FIND_COORDINATOR, offsets_topic=True
        ),
        ApiSpec(
            K.CONSUMER_GROUP_HEARTBEAT,
            V0,
            GroupApi.consumer_group_heartbeat,
            group(Op.READ),
            offsets_topic=True,
            concurrent=True,
        ),
        ApiSpec(
            K.OFFSET_COMMIT,
            V0,
            GroupApi.offset_commit,
            OFFSET_COMMIT,
            offsets_topic=True,
            concurrent=True,
        ),
        ApiSpec(
            K.TXN_OFFSET_COMMIT,
            V0,
            GroupApi.txn_offset_commit,
            TXN_OFFSET_COMMIT,
            offsets_topic=True,
        ),
        ApiSpec(
            K.OFFSET_FETCH,
            V0,
            GroupApi.offset_fetch,
            group(Op.DESCRIBE),
            offsets_topic=True,
            read_only=True,
            concurrent=True,
        ),
        ApiSpec(
            K.LIST_GROUPS,
            V0,
            GroupApi.list_groups,
            InHandler("DESCRIBE on each group listed: only those are shown"),
            offsets_topic=True,
            read_only=True,
        ),
        ApiSpec(
            K.CONSUMER_GROUP_DESCRIBE,
            V0,
            GroupApi.consumer_group_describe,
            InHandler("DESCRIBE on each group"),
            offsets_topic=True,
            read_only=True,
        ),
        ApiSpec(K.DELETE_GROUPS, V0, GroupApi.delete_groups, group(Op.DELETE), offsets_topic=True),
        ApiSpec(K.OFFSET_DELETE, V0, GroupApi.offset_delete, group(Op.DELETE), offsets_topic=True),
        ApiSpec(
            K.DESCRIBE_CLUSTER,
            V0,
            ClusterApi.describe_cluster,
            Unchecked("the brokers and the controller, as Metadata tells anyone"),
            read_only=True,
        ),
        ApiSpec(
            K.DESCRIBE_QUORUM, V0, ClusterApi.describe_quorum, cluster(Op.DESCRIBE), read_only=True
        ),
        ApiSpec(
            K.BROKER_REGISTRATION,
            V0,
            ClusterApi.broker_registration,
            BrokersOnly(),
            throttled=False,
        ),
        ApiSpec(
            K.BROKER_HEARTBEAT, V0, ClusterApi.broker_heartbeat, BrokersOnly(), throttled=False
        ),
        ApiSpec(
            K.ALLOCATE_PRODUCER_IDS,
            V0,
            ClusterApi.allocate_producer_ids,
            BrokersOnly(),
            throttled=False,
        ),
        ApiSpec(K.ALTER_PARTITION, V0, ClusterApi.alter_partition, BrokersOnly(), throttled=False),
        ApiSpec(
            K.ALTER_REMOTE_SEGMENTS,
            V0,
            ClusterApi.alter_remote_segments,
            BrokersOnly(),
            throttled=False,
        ),
        ApiSpec(
            K.DESCRIBE_REMOTE_TIER,
            V0,
            RemoteTierApi.describe_remote_tier,
            cluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(K.WRITE_TXN_MARKERS, V0, TxnApi.write_txn_markers, BrokersOnly(), throttled=False),
        ApiSpec(K.ADD_PARTITIONS_TO_TXN, V0, TxnApi.add_partitions_to_txn, ADD_PARTITIONS),
        ApiSpec(K.ADD_OFFSETS_TO_TXN, V0, TxnApi.add_offsets_to_txn, ADD_OFFSETS),
        ApiSpec(K.END_TXN, V0, TxnApi.end_txn, END_TXN),
        ApiSpec(
            K.DESCRIBE_PRODUCERS, V0, TxnApi.describe_producers, topics(Op.READ), read_only=True
        ),
        ApiSpec(
            K.DESCRIBE_TRANSACTIONS,
            V0,
            TxnApi.describe_transactions,
            InHandler("DESCRIBE on each transactional id"),
            read_only=True,
        ),
        ApiSpec(
            K.LIST_TRANSACTIONS,
            V0,
            TxnApi.list_transactions,
            InHandler("DESCRIBE on each transactional id listed"),
            read_only=True,
        ),
        ApiSpec(
            K.DESCRIBE_LOG_DIRS,
            V0,
            ReassignmentApi.describe_log_dirs,
            cluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(
            K.ELECT_LEADERS, V0, ReassignmentApi.elect_leaders, cluster(Op.ALTER), controller=True
        ),
        ApiSpec(
            K.ALTER_PARTITION_REASSIGNMENTS,
            V0,
            ReassignmentApi.alter_partition_reassignments,
            cluster(Op.ALTER),
            controller=True,
        ),
        ApiSpec(
            K.LIST_PARTITION_REASSIGNMENTS,
            V0,
            ReassignmentApi.list_partition_reassignments,
            cluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(
            K.DESCRIBE_ACLS, V0, SecurityApi.describe_acls, cluster(Op.DESCRIBE), read_only=True
        ),
        ApiSpec(K.CREATE_ACLS, V0, SecurityApi.create_acls, cluster(Op.ALTER), controller=True),
        ApiSpec(K.DELETE_ACLS, V0, SecurityApi.delete_acls, cluster(Op.ALTER), controller=True),
        ApiSpec(
            K.DESCRIBE_CLIENT_QUOTAS,
            V0,
            SecurityApi.describe_client_quotas,
            cluster(Op.DESCRIBE_CONFIGS),
            read_only=True,
        ),
        ApiSpec(
            K.ALTER_CLIENT_QUOTAS,
            V0,
            SecurityApi.alter_client_quotas,
            cluster(Op.ALTER_CONFIGS),
            controller=True,
        ),
        ApiSpec(
            K.DESCRIBE_USER_SCRAM_CREDENTIALS,
            V0,
            SecurityApi.describe_user_scram_credentials,
            cluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(
            K.ALTER_USER_SCRAM_CREDENTIALS,
            V0,
            SecurityApi.alter_user_scram_credentials,
            cluster(Op.ALTER),
            controller=True,
        ),
    ],
)
