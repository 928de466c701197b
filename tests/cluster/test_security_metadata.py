"""SCRAM credentials, ACLs and client quotas in the metadata log: records, image, controller."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from logmq.cluster.controller import Controller
from logmq.cluster.controller_api import ClientQuotaAlteration
from logmq.cluster.metadata_image import EMPTY_IMAGE, MetadataError, MetadataImage
from logmq.cluster.metadata_loader import MetadataLoader
from logmq.cluster.metadata_records import (
    BATCH_VERSION,
    MAX_BYTES_FIELD,
    AccessControlEntryRecord,
    ClientQuotaRecord,
    MetadataCodecError,
    RemoveAccessControlEntry,
    RemoveUserScramCredential,
    UserScramCredentialRecord,
    decode_records,
    encode_records,
)
from logmq.cluster.security_image import (
    MATCH_DEFAULT,
    MATCH_EXACT,
    MATCH_SPECIFIED,
    QuotaFilterComponent,
    acl_record,
    scram_record,
)
from logmq.errors import ErrorCode
from logmq.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from logmq.security.scram import ScramCredential, parse_add_scram
from tests.cluster.helpers import CONFIG, Recorder, ids

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def cred(mechanism: str = SHA256, password: str = "pw", iterations: int = 4096):
    return ScramCredential.from_password(mechanism, password, iterations, salt=b"salt")


def acl(name="t", principal="User:alice", op=AclOperation.READ, perm=ALLOW, pattern=None):
    return AclBinding(
        ResourcePattern(ResourceType.TOPIC, name, pattern or PatternType.LITERAL),
        AccessControlEntry(principal, "*", op, perm),
    )


def uuids():
    n = iter(range(1, 10_000))
    return lambda: f"{next(n):032x}"


def controller(image: MetadataImage = EMPTY_IMAGE) -> Controller:
    return Controller(image, 0, CONFIG, new_id=uuids())


def committed(result, image: MetadataImage, offset: int) -> MetadataImage:
    """``image`` after the result's records went through the codec, as a follower applies."""
    return image.apply(decode_records(encode_records(result.records)), offset)


# -- records and the codec ------------------------------------------------------------------

SAMPLES = [
    scram_record("alice", cred()),
    RemoveUserScramCredential("alice", SHA256),
    acl_record("0" * 32, acl()),
    RemoveAccessControlEntry("0" * 32),
    ClientQuotaRecord((("client-id", None), ("user", "alice")), "producer_byte_rate", 1024.0),
    ClientQuotaRecord((("user", None),), "request_percentage", None),
]


def test_security_records_round_trip():
    assert decode_records(encode_records(SAMPLES)) == SAMPLES
    # stored and server keys stay out of logs
    assert "stored_key" not in repr(SAMPLES[0]) and "server_key" not in repr(SAMPLES[0])


def _batch(*raw_records) -> bytes:
    return msgpack.packb([BATCH_VERSION, list(raw_records)], use_bin_type=True)


@pytest.mark.parametrize(
    "raw",
    [
        [12, "alice", SHA256, "salt-as-str", b"k" * 32, b"k" * 32, 4096],  # str for bytes
        [12, "alice", SHA256, b"s" * (MAX_BYTES_FIELD + 1), b"k" * 32, b"k" * 32, 4096],
        [12, "alice", SHA256, b"s", b"k" * 32],  # truncated
        [13, "alice"],  # truncated removal
        [14, "id", "2", "t", 3, "User:a", "*", 3, 3],  # str for an enum code
        [15, 7],
        [16, [["user", "a", "extra"]], "producer_byte_rate", 1.0],  # not a pair
        [16, [["user", 5]], "producer_byte_rate", 1.0],  # a name that is no string
        [16, [["user", None]] * 5, "producer_byte_rate", 1.0],  # too many components
        [16, "user", "producer_byte_rate", 1.0],
        [16, [["user", None]], "producer_byte_rate", "1.0"],  # str for a float
        [16, [["user", None]], "producer_byte_rate", 1],  # an int is not a float
        [16, [["user", None]]],  # truncated
    ],
)
def test_the_codec_refuses_hostile_or_truncated_security_records(raw):
    with pytest.raises(MetadataCodecError):
        decode_records(_batch(raw))


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_codec(data):
    for prefix in (b"", _batch()[:-1]):
        try:
            decode_records(prefix + data)
        except MetadataCodecError:
            pass


@given(st.lists(st.sampled_from(SAMPLES), max_size=6), st.integers(0, 200))
def test_any_truncation_of_a_batch_is_refused_or_exact(records, cut):
    data = encode_records(records)
    try:
        decoded = decode_records(data[: len(data) - cut] if cut else data)
    except MetadataCodecError:
        assert cut > 0
    else:
        assert cut == 0 and decoded == records


# -- the image ------------------------------------------------------------------------------


def test_image_applies_security_records_and_keeps_structural_sharing():
    image = EMPTY_IMAGE.apply(SAMPLES[:1] + SAMPLES[2:3] + SAMPLES[4:5], offset=5)
    sec = image.security
    assert sec.scram_credential("alice", SHA256) == cred()
    assert sec.acl_bindings == (acl(),) and sec.acl_version == 5
    assert sec.quotas[(("client-id", None), ("user", "alice"))] == {"producer_byte_rate": 1024.0}
    # a batch without security records shares the security image as it is
    from logmq.cluster.metadata_records import ProducerIdsBlock

    later = image.apply([ProducerIdsBlock(1, 10)], offset=6)
    assert later.security is sec and later.security.acl_bindings is sec.acl_bindings
    # a quota change leaves the ACL version (an authorizer need not be rebuilt)
    quota = later.apply([ClientQuotaRecord((("user", None),), "consumer_byte_rate", 5.0)], 7)
    assert quota.security.acl_version == 5 and quota.security.acls is sec.acls
    # an ACL change moves it to the batch's offset
    removed = quota.apply([RemoveAccessControlEntry("0" * 32)], offset=9)
    assert removed.security.acl_bindings == () and removed.security.acl_version == 9
    # snapshots carry everything
    restored = MetadataImage.from_bytes(quota.to_bytes(), 7)
    assert restored.security.scram == quota.security.scram
    assert restored.security.acls == quota.security.acls
    assert restored.security.quotas == quota.security.quotas
    # removals
    gone = quota.apply(
        [
            RemoveUserScramCredential("alice", SHA256),
            ClientQuotaRecord((("client-id", None), ("user", "alice")), "producer_byte_rate", None),
        ]
    )
    assert not gone.security.scram
    assert (("client-id", None), ("user", "alice")) not in gone.security.quotas


@pytest.mark.parametrize(
    "record",
    [
        RemoveUserScramCredential("nobody", SHA256),
        RemoveAccessControlEntry("unknown"),
        UserScramCredentialRecord("alice", "SCRAM-SHA-1", b"s", b"k" * 20, b"k" * 20, 4096),
        UserScramCredentialRecord("alice", SHA256, b"s", b"k" * 32, b"k" * 32, 10),
        UserScramCredentialRecord("alice", SHA256, b"s", b"short", b"k" * 32, 4096),
        UserScramCredentialRecord("", SHA256, b"s", b"k" * 32, b"k" * 32, 4096),
        AccessControlEntryRecord("x", 99, "t", 3, "User:a", "*", 3, 3),  # unknown code
        AccessControlEntryRecord("x", 2, "t", 1, "User:a", "*", 3, 3),  # pattern ANY
        AccessControlEntryRecord("x", 2, "t", 3, "no-colon", "*", 3, 3),
        ClientQuotaRecord((), "producer_byte_rate", 1.0),
        ClientQuotaRecord((("ip", None),), "producer_byte_rate", 1.0),
        ClientQuotaRecord((("user", "a"), ("client-id", "c")), "producer_byte_rate", 1.0),
        ClientQuotaRecord((("user", ""),), "producer_byte_rate", 1.0),
        ClientQuotaRecord((("user", None),), "producer_byte_rate", -1.0),
        ClientQuotaRecord((("user", None),), "request_percentage", float("nan")),
    ],
)
def test_records_that_cannot_apply_reject_the_batch(record):
    with pytest.raises(MetadataError):
        EMPTY_IMAGE.apply([record])


def test_an_acl_id_is_never_reused_and_the_loader_rejects_a_bad_batch_whole():
    loader = MetadataLoader()
    loader.apply(1, encode_records([acl_record("a", acl())]))
    bad = encode_records([acl_record("b", acl("u")), acl_record("a", acl("v"))])
    with pytest.raises(MetadataError):
        loader.apply(2, bad)
    assert loader.image.security.acl_bindings == (acl(),) and loader.image.offset == 2


def test_authorizer_from_the_image():
    image = EMPTY_IMAGE.apply([acl_record("a", acl(principal="User:bob"))])
    authz = image.security.authorizer()
    assert authz.authorize("User:bob", "h", AclOperation.READ, ResourceType.TOPIC, "t")
    assert not authz.authorize("User:eve", "h", AclOperation.READ, ResourceType.TOPIC, "t")


# -- the controller -------------------------------------------------------------------------


def test_alter_scram_credentials_upserts_and_deletes_per_user():
    c = controller()
    r = c.alter_scram_credentials([("alice", cred()), ("bob", cred(SHA512))], [])
    assert {n: res.error for n, res in r.response.items()} == {
        "alice": ErrorCode.NONE,
        "bob": ErrorCode.NONE,
    }
    image = committed(r, EMPTY_IMAGE, 1)
    assert image.security.scram_credential("bob", SHA512) == cred(SHA512)
    c = controller(image)
    r = c.alter_scram_credentials([("bob", cred(SHA512, "new"))], [("alice", SHA256)])
    assert all(res.ok for res in r.response.values())
    image = committed(r, image, 2)
    assert image.security.scram_credential("alice", SHA256) is None
    assert image.security.scram_credential("bob", SHA512) == cred(SHA512, "new")
    # and the described view never shows keys
    assert image.security.describe_scram(None)[0].credentials == ((SHA512, 4096),)


def test_alter_scram_credentials_errors_follow_kafka():
    c = controller(EMPTY_IMAGE.apply([scram_record("carol", cred())]))
    r = c.alter_scram_credentials(
        [("", cred()), ("dave", cred()), ("dave", cred(SHA512)), ("erin", cred())],
        [("nobody", SHA256), ("carol", "SCRAM-SHA-1"), ("frank", SHA256)],
    )
    errors = {n: res.error for n, res in r.response.items()}
    assert errors == {
        "nobody": ErrorCode.RESOURCE_NOT_FOUND,
        "carol": ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        "frank": ErrorCode.RESOURCE_NOT_FOUND,
        "": ErrorCode.UNACCEPTABLE_CREDENTIAL,
        "dave": ErrorCode.DUPLICATE_RESOURCE,
        "erin": ErrorCode.NONE,
    }
    assert list(r.response) == ["nobody", "carol", "frank", "", "dave", "erin"]
    # only erin's change is written: a refused user changes nothing
    assert [(rec.name, rec.mechanism) for rec in r.records] == [("erin", SHA256)]
    # a deletion and an upsertion of one user in one request: a duplicate too
    r = c.alter_scram_credentials([("carol", cred(SHA512))], [("carol", SHA256)])
    assert r.response["carol"].error is ErrorCode.DUPLICATE_RESOURCE and not r.records


def test_bad_iterations_are_unacceptable():
    good = cred()
    too_few = object.__new__(ScramCredential)
    for k, v in {**good.__dict__, "iterations": 100}.items():
        object.__setattr__(too_few, k, v)
    r = controller().alter_scram_credentials([("alice", too_few)], [])
    assert r.response["alice"].error is ErrorCode.UNACCEPTABLE_CREDENTIAL and not r.records


def test_a_salt_the_codec_would_refuse_never_reaches_the_log():
    big = ScramCredential.from_password(SHA256, "pw", salt=b"s" * (MAX_BYTES_FIELD + 1))
    r = controller().alter_scram_credentials([("alice", big)], [])
    assert r.response["alice"].error is ErrorCode.UNACCEPTABLE_CREDENTIAL and not r.records
    with pytest.raises(ValueError):
        controller().bootstrap("c", scram=[("alice", big)])


def test_bootstrap_writes_credentials_only_on_the_first_start():
    _, name, admin = parse_add_scram("SCRAM-SHA-512=[name=admin,password=secret]")
    c = Controller(EMPTY_IMAGE, 0, CONFIG, new_id=ids())
    r = c.bootstrap("cluster-1", scram=[(name, admin)])
    assert r.response == "cluster-1"
    assert [type(rec).__name__ for rec in r.records] == [
        "ClusterIdRecord",
        "UserScramCredentialRecord",
    ]
    image = committed(r, EMPTY_IMAGE, 1)
    assert image.security.scram_credential("admin", SHA512) == admin
    # a later start (the cluster has an id) ignores them, even with another password
    _, _, other = parse_add_scram("SCRAM-SHA-512=[name=admin,password=changed]")
    again = Controller(image, 0, CONFIG).bootstrap("cluster-1", scram=[("admin", other)])
    assert again.records == [] and again.response == "cluster-1"


def test_keep_existing_creates_a_missing_credential_and_leaves_a_stored_one():
    """--add-scram on a cluster that exists: brokers given the same option all ask, the
    first one's credential is written and the others' change nothing."""
    _, _, first = parse_add_scram("SCRAM-SHA-512=[name=admin,password=secret]")
    _, _, second = parse_add_scram("SCRAM-SHA-512=[name=admin,password=secret]")
    c = controller()
    r = c.alter_scram_credentials([("admin", first)], [], keep_existing=True)
    assert r.response["admin"].ok and len(r.records) == 1
    image = committed(r, EMPTY_IMAGE, 1)
    again = Controller(image, 0, CONFIG)
    r = again.alter_scram_credentials([("admin", second)], [], keep_existing=True)
    assert r.response["admin"].ok and r.records == []
    assert again.image.security.scram_credential("admin", SHA512) == first
    # another mechanism is another credential; without the flag an upsertion replaces
    _, _, sha256 = parse_add_scram("SCRAM-SHA-256=[name=admin,password=other]")
    r = again.alter_scram_credentials([("admin", sha256)], [], keep_existing=True)
    assert r.response["admin"].ok and len(r.records) == 1
    r = again.alter_scram_credentials([("admin", second)], [])
    assert r.response["admin"].ok and len(r.records) == 1
    # a user named twice is still refused, kept or not
    r = again.alter_scram_credentials([("admin", first), ("admin", sha256)], [], keep_existing=True)
    assert r.response["admin"].error is ErrorCode.DUPLICATE_RESOURCE and r.records == []


def test_create_acls_validates_and_never_duplicates():
    c = controller()
    bad = AclBinding(
        ResourcePattern(ResourceType.CLUSTER, "not-the-cluster"),
        AccessControlEntry("User:a", "*", AclOperation.ALTER, ALLOW),
    )
    r = c.create_acls([acl(), bad, acl()])
    assert [res.error for res in r.response] == [
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NONE,
    ]
    assert "kafka-cluster" in r.response[1].message
    assert len(r.records) == 1
    image = committed(r, EMPTY_IMAGE, 1)
    (acl_id,) = image.security.acls
    assert len(acl_id) == 36  # a UUID string
    r = controller(image).create_acls([acl()])
    assert r.response[0].ok and r.records == []  # already there


def test_delete_acls_per_filter():
    c = controller()
    image = committed(
        c.create_acls(
            [
                acl("a"),
                acl("b", op=AclOperation.WRITE),
                acl("pre", pattern=PatternType.PREFIXED, perm=DENY),
            ]
        ),
        EMPTY_IMAGE,
        1,
    )
    c = controller(image)
    r = c.delete_acls(
        [
            AclBindingFilter(operation=AclOperation.READ),  # a and pre
            AclBindingFilter(),  # everything left: only b (a binding is deleted once)
            AclBindingFilter(resource_type=ResourceType.UNKNOWN),
        ]
    )
    first, second, third = r.response
    assert set(first.deleted) == {acl("a"), acl("pre", pattern=PatternType.PREFIXED, perm=DENY)}
    assert second.deleted == (acl("b", op=AclOperation.WRITE),)
    assert third.error is ErrorCode.INVALID_REQUEST
    assert committed(r, image, 2).security.acls == {}
    # MATCH filters what would apply to a name (prefixed included)
    match = AclBindingFilter(name="prefix-topic", pattern_type=PatternType.MATCH)
    assert image.security.matching_acls(match) == [
        acl("pre", pattern=PatternType.PREFIXED, perm=DENY)
    ]


def test_alter_and_describe_client_quotas():
    c = controller()
    r = c.alter_client_quotas(
        [
            ClientQuotaAlteration({"user": "alice"}, {"producer_byte_rate": 1024}),
            ClientQuotaAlteration({"user": None}, {"consumer_byte_rate": 2048.0}),
            ClientQuotaAlteration(
                {"user": "alice", "client-id": "app"}, {"request_percentage": 12.5}
            ),
            ClientQuotaAlteration({"client-id": None}, {"controller_mutation_rate": 3.0}),
            ClientQuotaAlteration({"user": "bob"}, {"producer_byte_rate": 0}),
            ClientQuotaAlteration({"user": "bob"}, {"producer_byte_rate": 1.5}),
            ClientQuotaAlteration({"user": "bob"}, {"no_such_key": 1.0}),
            ClientQuotaAlteration({"ip": "1.2.3.4"}, {"producer_byte_rate": 1.0}),
            ClientQuotaAlteration({}, {"producer_byte_rate": 1.0}),
            ClientQuotaAlteration({"user": ""}, {"producer_byte_rate": 1.0}),
            ClientQuotaAlteration({"user": "bob"}, {"producer_byte_rate": 10**400}),
            ClientQuotaAlteration({"user": "bob"}, {"request_percentage": float("inf")}),
        ]
    )
    assert [res.error for res in r.response] == [ErrorCode.NONE] * 4 + [
        ErrorCode.INVALID_REQUEST
    ] * 8
    image = committed(r, EMPTY_IMAGE, 1)
    sec = image.security
    assert sec.quotas[(("user", "alice"),)] == {"producer_byte_rate": 1024.0}

    def described(*components, strict=False):
        d = sec.describe_client_quotas(components, strict)
        assert d.error is ErrorCode.NONE, d.message
        return [dict(entity) for entity, _ in d.entries]

    user = "user"
    assert described(QuotaFilterComponent(user, MATCH_EXACT, "alice")) == [
        {"client-id": "app", "user": "alice"},
        {"user": "alice"},
    ]
    assert described(QuotaFilterComponent(user, MATCH_EXACT, "alice"), strict=True) == [
        {"user": "alice"}
    ]
    assert described(QuotaFilterComponent(user, MATCH_DEFAULT)) == [{"user": None}]
    assert described(QuotaFilterComponent("client-id", MATCH_SPECIFIED)) == [
        {"client-id": "app", "user": "alice"}
    ]
    assert len(described()) == 4
    bad = sec.describe_client_quotas([QuotaFilterComponent("ip", MATCH_DEFAULT)])
    assert bad.error is ErrorCode.INVALID_REQUEST
    # validate_only writes nothing; None removes; an unchanged value writes nothing
    c = controller(image)
    r = c.alter_client_quotas(
        [ClientQuotaAlteration({"user": "alice"}, {"producer_byte_rate": None})],
        validate_only=True,
    )
    assert r.response[0].ok and r.records == []
    r = c.alter_client_quotas(
        [
            ClientQuotaAlteration({"user": "alice"}, {"producer_byte_rate": None}),
            ClientQuotaAlteration({"user": None}, {"consumer_byte_rate": 2048}),
        ]
    )
    assert all(res.ok for res in r.response) and len(r.records) == 1
    assert (("user", "alice"),) not in committed(r, image, 2).security.quotas


def test_describe_scram_errors():
    image = EMPTY_IMAGE.apply([scram_record("a", cred()), scram_record("a", cred(SHA512))])
    out = image.security.describe_scram(["a", "b", "a", "c"])
    assert [(d.user, d.error) for d in out] == [
        ("a", ErrorCode.DUPLICATE_RESOURCE),
        ("b", ErrorCode.RESOURCE_NOT_FOUND),
        ("c", ErrorCode.RESOURCE_NOT_FOUND),
    ]
    assert image.security.describe_scram(["a"])[0].credentials == ((SHA256, 4096), (SHA512, 4096))


def test_security_state_replays_like_the_controller_saw_it():
    rec = Recorder()
    rec.run(rec.controller.create_acls([acl("x"), acl("y")]))
    rec.run(rec.controller.alter_scram_credentials([("u", cred())], []))
    rec.run(rec.controller.delete_acls([AclBindingFilter(name="x")]))
    replayed = rec.replayed()
    assert replayed.security.acls == rec.image.security.acls
    assert replayed.security.scram == rec.image.security.scram
