"""Every API the Kafka listeners serve, one entry each: versions, handler, ACL, scheduling.

The ApiVersions answer, the codec's version check, the pipeline's steps (authentication,
authorization, the offsets topic, the request-time quota), the connection's scheduling and
the version tables of docs/kafka-compatibility.md all read this table, so it is the one
place to add an API (net/api_registry.py says what each field means).

Versions are chosen so every client we test picks its modern path: librdkafka turns
features on by probing exact versions (record batch v2 needs Produce 3 and Fetch 4; ZSTD
Produce 7 and Fetch 10; its lz4 check wants Produce 0 inside the range, so Produce is
advertised from 0 and versions 0-2, which carry the old message formats, are answered
UNSUPPORTED_VERSION); kafka-python guesses the broker's release from the list
(ListOffsets 7 reads as Kafka 3.0: v2 batches and idempotence); aiokafka takes the
highest version inside each range it knows. Every version Kafka 3.9 serves is here except
Fetch 0-3 and Produce 0-2; versions kio no longer generates (Kafka 4.0 dropped them,
KIP-896) are defined in legacy.py.
"""

from __future__ import annotations

from logmq.kafka.access import (
    AllOf,
    InHandler,
    OnCluster,
    OnConfigResources,
    OnGroup,
    OnTopics,
    Unchecked,
)
from logmq.kafka.apis import KafkaApis
from logmq.kafka.codec import KafkaWire
from logmq.kafka.configs import KafkaConfigApis
from logmq.kafka.consumer_groups import KafkaConsumerGroupApis
from logmq.kafka.group_membership import KafkaGroupMembershipApis
from logmq.kafka.groups import KafkaGroupApis
from logmq.kafka.offsets import KafkaOffsetApis
from logmq.kafka.partition_admin import KafkaPartitionAdminApis
from logmq.kafka.producers import KafkaProducerApis
from logmq.kafka.sasl import KafkaSaslApis
from logmq.kafka.security_admin import KafkaSecurityAdminApis
from logmq.kafka.topics import KafkaTopicApis
from logmq.kafka.transactions import KafkaTransactionApis
from logmq.net.api_registry import ApiRegistry, ApiSpec
from logmq.net.codec import ApiKey as K
from logmq.security.acl import AclOperation as Op

KAFKA_APIS = ApiRegistry(
    "kafka",
    [
        # -- data ---------------------------------------------------------------------
        ApiSpec(
            K.PRODUCE,
            (0, 11),
            KafkaApis.produce,
            InHandler("WRITE on each topic; a transactional one WRITE on its transactional id"),
            oldest_served=3,  # 0-2: the message formats before RecordBatch v2
            concurrent=True,  # overlaps its durability waits (net/server.py)
        ),
        ApiSpec(
            K.FETCH,
            (4, 17),  # 0-3: the old message formats; 13+: topic ids
            KafkaApis.fetch,
            InHandler("READ on each topic"),
            read_only=True,
        ),
        ApiSpec(
            K.LIST_OFFSETS,
            (0, 9),
            KafkaApis.list_offsets,
            InHandler("DESCRIBE on each topic"),
            read_only=True,
        ),
        ApiSpec(
            K.METADATA,
            (0, 12),
            KafkaApis.metadata,
            InHandler("DESCRIBE on each topic listed; CREATE to auto-create"),
            read_only=True,
        ),
        ApiSpec(
            K.OFFSET_FOR_LEADER_EPOCH,
            (0, 4),  # librdkafka validates positions with v2
            KafkaApis.offset_for_leader_epoch,
            OnTopics(Op.DESCRIBE, "topic"),
            read_only=True,
        ),
        ApiSpec(
            K.DELETE_RECORDS,
            (0, 2),
            KafkaPartitionAdminApis.delete_records,
            OnTopics(Op.DELETE),
        ),
        ApiSpec(
            K.INIT_PRODUCER_ID,
            (0, 5),
            KafkaApis.init_producer_id,
            InHandler("WRITE on the transactional id, else IDEMPOTENT_WRITE or WRITE on a topic"),
        ),
        # -- groups -------------------------------------------------------------------
        ApiSpec(
            K.OFFSET_COMMIT,
            (0, 9),  # v0/v1: legacy.py (Sarama 1.2x commits with v1)
            KafkaOffsetApis.offset_commit,
            AllOf((OnGroup(Op.READ), OnTopics(Op.READ))),
            offsets_topic=True,
        ),
        ApiSpec(
            K.OFFSET_FETCH,
            (0, 9),
            KafkaOffsetApis.offset_fetch,
            OnGroup(Op.DESCRIBE, batched_from=8),
            read_only=True,
            offsets_topic=True,
        ),
        ApiSpec(
            K.FIND_COORDINATOR,
            (0, 6),  # v4+: batched keys
            KafkaOffsetApis.find_coordinator,
            OnGroup(Op.DESCRIBE, batched_from=4),
            read_only=True,
            offsets_topic=True,
        ),
        ApiSpec(
            K.JOIN_GROUP,
            (0, 9),  # v4+: KIP-394 member ids; v5+ static members
            KafkaGroupMembershipApis.join_group,
            OnGroup(Op.READ),
            offsets_topic=True,
        ),
        ApiSpec(
            K.HEARTBEAT,
            (0, 4),
            KafkaGroupMembershipApis.heartbeat,
            OnGroup(Op.READ),
            offsets_topic=True,
        ),
        ApiSpec(
            K.LEAVE_GROUP,
            (0, 5),
            KafkaGroupMembershipApis.leave_group,
            OnGroup(Op.READ),
            offsets_topic=True,
        ),
        ApiSpec(
            K.SYNC_GROUP,
            (0, 5),
            KafkaGroupMembershipApis.sync_group,
            OnGroup(Op.READ),
            offsets_topic=True,
        ),
        ApiSpec(
            K.DESCRIBE_GROUPS,
            (0, 5),
            KafkaGroupApis.describe_groups,
            InHandler("DESCRIBE on each group"),
            read_only=True,
            offsets_topic=True,
        ),
        ApiSpec(
            K.LIST_GROUPS,
            (0, 5),  # v5: group types
            KafkaGroupApis.list_groups,
            InHandler("DESCRIBE on the cluster, else only the groups it may describe"),
            read_only=True,
            offsets_topic=True,
        ),
        ApiSpec(
            K.DELETE_GROUPS,
            (0, 2),
            KafkaGroupApis.delete_groups,
            InHandler("DELETE on each group"),
            offsets_topic=True,
        ),
        ApiSpec(
            K.OFFSET_DELETE,
            (0, 0),
            KafkaGroupApis.offset_delete,
            OnGroup(Op.DELETE),
            offsets_topic=True,
        ),
        ApiSpec(
            K.CONSUMER_GROUP_HEARTBEAT,
            (0, 1),  # KIP-848; librdkafka's group.protocol=consumer needs 1
            KafkaConsumerGroupApis.heartbeat,
            OnGroup(Op.READ),
            offsets_topic=True,
        ),
        ApiSpec(
            K.CONSUMER_GROUP_DESCRIBE,
            (0, 1),
            KafkaConsumerGroupApis.describe,
            InHandler("DESCRIBE on each group"),
            read_only=True,
            offsets_topic=True,
        ),
        # -- transactions -------------------------------------------------------------
        ApiSpec(
            K.ADD_PARTITIONS_TO_TXN,
            (0, 4),  # v4: batched, verify_only, from brokers (KIP-890)
            KafkaTransactionApis.add_partitions_to_txn,
            InHandler("WRITE on the transactional id and each topic; v4 CLUSTER_ACTION"),
        ),
        ApiSpec(
            K.ADD_OFFSETS_TO_TXN,
            (0, 3),
            KafkaTransactionApis.add_offsets_to_txn,
            InHandler("WRITE on the transactional id, READ on the group"),
        ),
        ApiSpec(
            K.END_TXN,
            (0, 4),  # v5 is KIP-890 part 2's epoch bump per transaction: not served
            KafkaTransactionApis.end_txn,
            InHandler("WRITE on the transactional id"),
        ),
        ApiSpec(
            K.TXN_OFFSET_COMMIT,
            (0, 3),  # v4+ is KIP-890 part 2: not served
            KafkaOffsetApis.txn_offset_commit,
            InHandler("WRITE on the transactional id, READ on the group and each topic"),
        ),
        ApiSpec(
            K.WRITE_TXN_MARKERS,
            (1, 2),  # an admin's abort (kafka/producers.py); v0 went in 4.0
            KafkaProducerApis.write_txn_markers,
            InHandler("CLUSTER_ACTION on the cluster"),
            throttled=False,  # an inter-broker API in Kafka: exempt from quotas
        ),
        ApiSpec(
            K.DESCRIBE_PRODUCERS,
            (0, 0),
            KafkaProducerApis.describe_producers,
            InHandler("READ on each topic"),
        ),
        ApiSpec(
            K.DESCRIBE_TRANSACTIONS,
            (0, 0),
            KafkaTransactionApis.describe_transactions,
            InHandler("DESCRIBE on each transactional id"),
        ),
        ApiSpec(
            K.LIST_TRANSACTIONS,
            (0, 1),  # v2's transactional id pattern: not served
            KafkaTransactionApis.list_transactions,
            InHandler("DESCRIBE on each transactional id listed"),
        ),
        # -- topics and configs -------------------------------------------------------
        ApiSpec(
            K.CREATE_TOPICS,
            (0, 7),  # v5+: configs in the answer; v7: topic ids
            KafkaTopicApis.create_topics,
            InHandler("CREATE on the cluster or on each topic"),
            controller=True,
        ),
        ApiSpec(
            K.DELETE_TOPICS,
            (0, 6),  # v6: by name or topic id
            KafkaTopicApis.delete_topics,
            InHandler("DELETE on each topic"),
            controller=True,
        ),
        ApiSpec(
            K.CREATE_PARTITIONS,
            (0, 3),
            KafkaTopicApis.create_partitions,
            InHandler("ALTER on each topic"),
            controller=True,
        ),
        ApiSpec(
            K.DESCRIBE_CONFIGS,
            (0, 4),  # v0: is_default, no synonyms
            KafkaConfigApis.describe_configs,
            # clients ask for many topics at once: each denied resource in its own entry
            InHandler("DESCRIBE_CONFIGS on each topic, or on the cluster for a broker"),
            read_only=True,
        ),
        ApiSpec(
            K.ALTER_CONFIGS,
            (0, 2),  # replaces a topic's overrides
            KafkaConfigApis.alter_configs,
            OnConfigResources(Op.ALTER_CONFIGS),
            controller=True,
        ),
        ApiSpec(
            K.INCREMENTAL_ALTER_CONFIGS,
            (0, 1),
            KafkaConfigApis.incremental_alter_configs,
            OnConfigResources(Op.ALTER_CONFIGS),
            controller=True,
        ),
        # -- partitions and the cluster -----------------------------------------------
        ApiSpec(
            K.DESCRIBE_LOG_DIRS,
            (0, 4),
            KafkaPartitionAdminApis.describe_log_dirs,
            OnCluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(
            K.ELECT_LEADERS,
            (0, 2),
            KafkaPartitionAdminApis.elect_leaders,
            OnCluster(Op.ALTER),
            controller=True,
        ),
        ApiSpec(
            K.ALTER_PARTITION_REASSIGNMENTS,
            (0, 1),
            KafkaPartitionAdminApis.alter_partition_reassignments,
            OnCluster(Op.ALTER),
            controller=True,
        ),
        ApiSpec(
            K.LIST_PARTITION_REASSIGNMENTS,
            (0, 0),
            KafkaPartitionAdminApis.list_partition_reassignments,
            OnCluster(Op.DESCRIBE),
            read_only=True,
        ),
        ApiSpec(
            K.DESCRIBE_CLUSTER,
            (0, 1),
            KafkaApis.describe_cluster,
            Unchecked("the brokers and the controller, as Metadata tells anyone"),
            read_only=True,
        ),
        # -- security -----------------------------------------------------------------
        ApiSpec(
            K.API_VERSIONS,
            (0, 4),
            KafkaApis.api_versions,
            Unchecked("what a client asks before it logs in"),
            read_only=True,
            before_auth=True,
        ),
        ApiSpec(
            K.SASL_HANDSHAKE,
            (0, 1),  # v0: raw tokens follow it (kafka/sasl.py)
            KafkaSaslApis.sasl_handshake,
            Unchecked("the login itself"),
            before_auth=True,
            throttled=False,
        ),
        ApiSpec(
            K.SASL_AUTHENTICATE,
            (0, 2),  # v1+: session lifetime (KIP-368)
            KafkaSaslApis.sasl_authenticate,
            Unchecked("the login itself"),
            before_auth=True,
            throttled=False,
        ),
        ApiSpec(
            K.DESCRIBE_ACLS,
            (1, 3),  # v0, before pattern types, went in Kafka 4.0 (KIP-896)
            KafkaSecurityAdminApis.describe_acls,
            OnCluster(Op.DESCRIBE),
        ),
        ApiSpec(
            K.CREATE_ACLS,
            (1, 3),
            KafkaSecurityAdminApis.create_acls,
            OnCluster(Op.ALTER),
            controller=True,
        ),
        ApiSpec(
            K.DELETE_ACLS,
            (1, 3),
            KafkaSecurityAdminApis.delete_acls,
            OnCluster(Op.ALTER),
            controller=True,
        ),
        ApiSpec(
            K.DESCRIBE_CLIENT_QUOTAS,
            (0, 1),
            KafkaSecurityAdminApis.describe_client_quotas,
            OnCluster(Op.DESCRIBE_CONFIGS),
        ),
        ApiSpec(
            K.ALTER_CLIENT_QUOTAS,
            (0, 1),
            KafkaSecurityAdminApis.alter_client_quotas,
            OnCluster(Op.ALTER_CONFIGS),
            controller=True,
        ),
        ApiSpec(
            K.DESCRIBE_USER_SCRAM_CREDENTIALS,
            (0, 0),
            KafkaSecurityAdminApis.describe_user_scram_credentials,
            OnCluster(Op.DESCRIBE),
        ),
        ApiSpec(
            K.ALTER_USER_SCRAM_CREDENTIALS,
            (0, 0),
            KafkaSecurityAdminApis.alter_user_scram_credentials,
            OnCluster(Op.ALTER),
            controller=True,
        ),
    ],
)

ADVERTISED = KAFKA_APIS.versions()  # api key -> (min, max): the ApiVersions answer
SERVED = KAFKA_APIS.served_versions()  # api key -> the versions answered


def kafka_wire() -> KafkaWire:
    """The Kafka listeners' codec, refusing before decoding what the registry leaves out."""
    return KafkaWire(ADVERTISED, SERVED)
