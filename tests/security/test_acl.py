"""The ACL model and authorizer against Kafka's rules (logmq/security/acl.py)."""

from __future__ import annotations

import timeit

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logmq.security.acl import (
    SUPPORTED_OPERATIONS,
    WILDCARD_PRINCIPAL,
    AccessControlEntry,
    AclAuthorizer,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AuthorizationCache,
    PatternType,
    ResourcePattern,
    ResourceType,
    binding_from_record,
    to_record,
    validate_binding,
    validate_filter,
)

Op = AclOperation
RT = ResourceType
PT = PatternType
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER = RT.TOPIC, RT.GROUP, RT.CLUSTER
LITERAL, PREFIXED = PT.LITERAL, PT.PREFIXED
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def acl(
    name: str = "t",
    op: AclOperation = Op.READ,
    perm: AclPermissionType = ALLOW,
    principal: str = ALICE,
    host: str = "*",
    *,
    rt: ResourceType = TOPIC,
    pt: PatternType = LITERAL,
) -> AclBinding:
    return AclBinding(ResourcePattern(rt, name, pt), AccessControlEntry(principal, host, op, perm))


def authz(*bindings: AclBinding, allow_if_none: bool = False, supers=()) -> AclAuthorizer:
    return AclAuthorizer(bindings, super_users=supers, allow_everyone_if_no_acl_found=allow_if_none)


def can(auth: AclAuthorizer, op=Op.READ, name="t", principal=ALICE, host=HOST, rt=TOPIC):
    return auth.authorize(principal, host, op, rt, name)


# -- wire codes --------------------------------------------------------------------------


def test_enum_codes_are_kafkas():
    assert [(m.name, int(m)) for m in ResourceType] == [
        ("UNKNOWN", 0), ("ANY", 1), ("TOPIC", 2), ("GROUP", 3), ("CLUSTER", 4),
        ("TRANSACTIONAL_ID", 5), ("DELEGATION_TOKEN", 6), ("USER", 7),
    ]  # fmt: skip
    assert [int(m) for m in PatternType] == [0, 1, 2, 3, 4]
    assert PatternType.LITERAL == 3 and PatternType.PREFIXED == 4 and PatternType.MATCH == 2
    assert Op.ALL == 2 and Op.READ == 3 and Op.DESCRIBE == 8 and Op.CLUSTER_ACTION == 9
    assert Op.IDEMPOTENT_WRITE == 12 and Op.CREATE_TOKENS == 13 and Op.DESCRIBE_TOKENS == 14
    assert [int(m) for m in AclOperation] == list(range(15))
    assert (AclPermissionType.ANY, DENY, ALLOW) == (1, 2, 3)


# -- authorize ---------------------------------------------------------------------------


def test_allow_grants_only_its_operation_and_principal():
    auth = authz(acl(op=Op.READ))
    assert can(auth, Op.READ)
    assert not can(auth, Op.WRITE)
    assert not can(auth, Op.READ, principal=BOB)
    assert not can(auth, Op.READ, name="other-with-no-acl")  # no ACL at all: default deny
    assert not can(auth, Op.READ, rt=GROUP)


def test_deny_wins_over_allow():
    auth = authz(acl(op=Op.READ), acl(op=Op.READ, perm=DENY, principal=WILDCARD_PRINCIPAL))
    assert not can(auth, Op.READ)
    auth = authz(acl(op=Op.ALL), acl(op=Op.WRITE, perm=DENY))
    assert can(auth, Op.READ)
    assert not can(auth, Op.WRITE)


def test_deny_all_denies_everything_allow_all_allows_everything():
    auth = authz(acl(op=Op.ALL))
    assert all(can(auth, op) for op in SUPPORTED_OPERATIONS[TOPIC])
    auth.add(acl(op=Op.ALL, perm=DENY))
    assert not any(can(auth, op) for op in SUPPORTED_OPERATIONS[TOPIC])


def test_wildcard_principal_and_host():
    auth = authz(acl(principal=WILDCARD_PRINCIPAL, host="*"))
    assert can(auth, principal=BOB, host="192.168.1.9")
    auth = authz(acl(host="10.0.0.1"))
    assert can(auth, host="10.0.0.1")
    assert not can(auth, host="10.0.0.2")
    # "User:*" is the only wildcard principal; another type's star is just a name
    auth = authz(acl(principal="Group:*"))
    assert not can(auth, principal=ALICE)
    assert can(auth, principal="Group:*")


def test_literal_wildcard_resource_applies_to_every_name():
    auth = authz(acl("*", Op.WRITE))
    assert can(auth, Op.WRITE, name="anything")
    assert can(auth, Op.WRITE, name="*")
    assert not can(auth, Op.WRITE, rt=GROUP, name="anything")


def test_prefixed():
    auth = authz(acl("fin", Op.READ, pt=PREFIXED))
    assert can(auth, name="fin")
    assert can(auth, name="finance.payments")
    assert not can(auth, name="fi")
    assert not can(auth, name="xfin")
    auth.add(acl("finance.", Op.READ, DENY, pt=PREFIXED))
    assert not can(auth, name="finance.payments")
    assert can(auth, name="finland")


def test_literal_name_is_not_a_prefix():
    auth = authz(acl("fin", Op.READ))
    assert not can(auth, name="finance")


def test_prefixed_star_is_a_literal_character_prefix_not_a_wildcard():
    # validate_binding refuses it, but if one is stored it only matches names starting '*'
    auth = AclAuthorizer()
    auth.add(acl("*", pt=PREFIXED))
    assert not can(auth, name="topic")
    assert can(auth, name="*x")


@pytest.mark.parametrize("granting", [Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE])
def test_allow_of_read_write_delete_alter_implies_describe(granting):
    auth = authz(acl(op=granting))
    assert can(auth, Op.DESCRIBE)


@pytest.mark.parametrize("granting", [Op.CREATE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS])
def test_other_operations_do_not_imply_describe(granting):
    assert not can(authz(acl(op=granting)), Op.DESCRIBE)


def test_alter_configs_implies_describe_configs_not_the_reverse():
    assert can(authz(acl(op=Op.ALTER_CONFIGS)), Op.DESCRIBE_CONFIGS)
    assert not can(authz(acl(op=Op.DESCRIBE_CONFIGS)), Op.ALTER_CONFIGS)
    assert not can(authz(acl(op=Op.DESCRIBE)), Op.READ)
    assert not can(authz(acl(op=Op.ALTER)), Op.ALTER_CONFIGS)


def test_deny_does_not_imply():
    # a DENY of READ denies READ, not DESCRIBE; the ALLOW of WRITE still implies DESCRIBE
    auth = authz(acl(op=Op.WRITE), acl(op=Op.READ, perm=DENY))
    assert can(auth, Op.DESCRIBE)
    assert not can(auth, Op.READ)
    auth = authz(acl(op=Op.ALTER_CONFIGS), acl(op=Op.ALTER_CONFIGS, perm=DENY))
    assert can(auth, Op.DESCRIBE_CONFIGS)
    # ... but a DENY of DESCRIBE itself beats the implied allow
    auth = authz(acl(op=Op.READ), acl(op=Op.DESCRIBE, perm=DENY))
    assert not can(auth, Op.DESCRIBE)
    assert can(auth, Op.READ)


def test_super_users_always_allowed():
    auth = authz(acl(op=Op.ALL, perm=DENY, principal=WILDCARD_PRINCIPAL), supers={"User:admin"})
    assert can(auth, Op.ALTER, principal="User:admin")
    assert can(auth, Op.CLUSTER_ACTION, principal="User:admin", rt=CLUSTER, name="kafka-cluster")
    assert not can(auth, Op.READ, principal=ALICE)


@pytest.mark.parametrize("allow_if_none", [False, True])
def test_no_acl_found(allow_if_none):
    auth = authz(acl("t", Op.READ, principal=BOB), allow_if_none=allow_if_none)
    # "other" has no ACL at all: the default decides
    assert can(auth, Op.WRITE, name="other") is allow_if_none
    # "t" has an ACL (for another principal and operation): no longer the default, deny
    assert can(auth, Op.WRITE, name="t") is False
    assert can(auth, Op.READ, name="t") is False


def test_allow_if_none_is_off_once_any_prefixed_or_wildcard_acl_applies():
    auth = authz(acl("t", Op.READ, principal=BOB, pt=PREFIXED), allow_if_none=True)
    assert not can(auth, Op.READ, name="topic")
    assert can(auth, Op.READ, name="x")
    auth = authz(acl("*", Op.READ, principal=BOB), allow_if_none=True)
    assert not can(auth, Op.READ, name="x")
    assert can(auth, Op.READ, name="x", rt=GROUP)


# -- the committed set -------------------------------------------------------------------


def test_add_remove_version_and_indexes():
    auth = AclAuthorizer()
    v0 = auth.version
    a, b = acl("pre", pt=PREFIXED), acl("t")
    assert auth.add(a) and auth.add(b)
    assert not auth.add(a)  # duplicate: no change
    assert auth.version == v0 + 2
    assert set(auth.bindings()) == {a, b} and len(auth) == 2
    assert can(auth, name="prefix")
    assert auth.remove(a)
    assert not auth.remove(a)
    assert auth.version == v0 + 3
    assert not can(auth, name="prefix")
    assert auth.remove(b)
    assert len(auth) == 0
    assert auth._literal[TOPIC] == {} and auth._prefixed[TOPIC] == {}
    assert auth._prefix_lengths[TOPIC] == ()
    auth.super_users = {"User:x"}
    auth.allow_everyone_if_no_acl_found = True
    assert auth.version == v0 + 6


def test_cannot_store_filter_pattern_types():
    with pytest.raises(ValueError):
        AclAuthorizer().add(acl(pt=PT.MATCH))


def test_matching_uses_the_filter():
    a, b, c = acl("t"), acl("*", Op.WRITE), acl("t-", pt=PREFIXED, principal=BOB)
    auth = authz(a, b, c)
    assert set(auth.matching(AclBindingFilter())) == {a, b, c}
    assert set(auth.matching(AclBindingFilter(TOPIC, "t-1", PT.MATCH))) == {b, c}
    assert set(auth.matching(AclBindingFilter(principal=BOB))) == {c}
    assert auth.matching(AclBindingFilter(GROUP)) == []


# -- cache -------------------------------------------------------------------------------


def test_cache_answers_and_invalidates_on_version_change():
    auth = authz(acl(op=Op.READ))
    cache = AuthorizationCache(auth, ALICE, HOST)
    assert cache.authorize(Op.READ, TOPIC, "t")
    assert not cache.authorize(Op.WRITE, TOPIC, "t")
    assert len(cache) == 2
    auth.add(acl(op=Op.READ, perm=DENY))
    assert not cache.authorize(Op.READ, TOPIC, "t")
    assert len(cache) == 1
    auth.remove(acl(op=Op.READ, perm=DENY))
    assert cache.authorize(Op.READ, TOPIC, "t")
    auth.super_users = {ALICE}
    assert cache.authorize(Op.WRITE, TOPIC, "t")
    auth.super_users = ()
    auth.allow_everyone_if_no_acl_found = True
    assert cache.authorize(Op.WRITE, TOPIC, "nothing-here")


def test_cache_is_bounded():
    auth = authz(allow_if_none=True)
    cache = AuthorizationCache(auth, ALICE, HOST, max_entries=8)
    for i in range(100):
        assert cache.authorize(Op.READ, TOPIC, f"t{i}")
        assert len(cache) <= 8


def test_cache_hit_costs_about_a_dict_lookup():
    auth = AclAuthorizer(
        [acl(f"topic-{i}", Op.WRITE, principal=f"User:u{i % 10}") for i in range(1000)]
    )
    cache = AuthorizationCache(auth, "User:u3", HOST)
    assert cache.authorize(Op.WRITE, TOPIC, "topic-3")
    table = {(Op.WRITE, TOPIC, "topic-3"): True}
    n = 20_000
    hit = min(timeit.repeat(lambda: cache.authorize(Op.WRITE, TOPIC, "topic-3"), number=n))
    bare = min(timeit.repeat(lambda: table.get((Op.WRITE, TOPIC, "topic-3")), number=n))
    # a method call and a version compare on top of the lookup; generous for a busy machine
    assert hit < bare * 6, (hit / n * 1e9, bare / n * 1e9)


# -- filters (as Kafka's ResourcePatternFilter / AccessControlEntryFilter tests) ---------


def pf(rt, name, pt) -> AclBindingFilter:
    return AclBindingFilter(rt, name, pt)


def rp(rt, name, pt) -> AclBinding:
    return AclBinding(ResourcePattern(rt, name, pt), AccessControlEntry(ALICE, "*", Op.READ, ALLOW))


@pytest.mark.parametrize(
    ("flt", "binding", "expected"),
    [
        (pf(TOPIC, "Name", LITERAL), rp(GROUP, "Name", LITERAL), False),
        (pf(TOPIC, "Name", LITERAL), rp(TOPIC, "Different", LITERAL), False),
        (pf(TOPIC, "Name", LITERAL), rp(TOPIC, "NAME", LITERAL), False),
        (pf(TOPIC, "Name", LITERAL), rp(TOPIC, "Name", PREFIXED), False),
        (pf(RT.ANY, "Name", LITERAL), rp(TOPIC, "Name", LITERAL), True),
        (pf(TOPIC, None, LITERAL), rp(TOPIC, "Name", LITERAL), True),
        (pf(TOPIC, "Name", PT.ANY), rp(TOPIC, "Name", LITERAL), True),
        (pf(TOPIC, "Name", PT.ANY), rp(TOPIC, "Name", PREFIXED), True),
        (pf(TOPIC, "Name", PT.MATCH), rp(TOPIC, "Name", LITERAL), True),
        (pf(TOPIC, "Name", PT.MATCH), rp(TOPIC, "Name", PREFIXED), True),
        (pf(TOPIC, "Name", LITERAL), rp(TOPIC, "Name", LITERAL), True),
        # the literal wildcard
        (pf(TOPIC, "*", LITERAL), rp(TOPIC, "*", LITERAL), True),
        (pf(TOPIC, "Name", LITERAL), rp(TOPIC, "*", LITERAL), False),
        (pf(TOPIC, "*", LITERAL), rp(TOPIC, "Name", LITERAL), False),
        (pf(TOPIC, "Name", PT.ANY), rp(TOPIC, "*", LITERAL), False),
        (pf(TOPIC, "Name", PT.MATCH), rp(TOPIC, "*", LITERAL), True),
        (pf(TOPIC, "*", PT.MATCH), rp(TOPIC, "Name", LITERAL), False),
        # prefixed
        (pf(TOPIC, "Name", PREFIXED), rp(TOPIC, "Name", PREFIXED), True),
        (pf(TOPIC, "Name", PREFIXED), rp(TOPIC, "Name-something", PREFIXED), False),
        (pf(TOPIC, "Name-something", PREFIXED), rp(TOPIC, "Name", PREFIXED), False),
        (pf(TOPIC, "Name-something", PT.ANY), rp(TOPIC, "Name", PREFIXED), False),
        (pf(TOPIC, "Name-something", PT.MATCH), rp(TOPIC, "Name", PREFIXED), True),
        (pf(TOPIC, "Nam", PT.MATCH), rp(TOPIC, "Name", PREFIXED), False),
        (pf(TOPIC, "Name-something", PT.MATCH), rp(TOPIC, "Name", LITERAL), False),
        (pf(TOPIC, None, PT.MATCH), rp(TOPIC, "Name", PREFIXED), True),
    ],
)
def test_pattern_filter(flt, binding, expected):
    assert flt.matches(binding) is expected


def test_entry_filter():
    b = acl("t", Op.READ, ALLOW, ALICE, "h1")
    assert AclBindingFilter(principal=ALICE, host="h1", operation=Op.READ).matches(b)
    assert AclBindingFilter(permission_type=ALLOW).matches(b)
    assert not AclBindingFilter(permission_type=DENY).matches(b)
    assert not AclBindingFilter(principal=BOB).matches(b)
    assert not AclBindingFilter(host="h2").matches(b)
    assert not AclBindingFilter(host="*").matches(b)  # filters compare exactly
    assert not AclBindingFilter(principal=WILDCARD_PRINCIPAL).matches(b)
    assert not AclBindingFilter(operation=Op.ALL).matches(b)  # ANY is the match-all, not ALL
    assert AclBindingFilter(operation=Op.ALL).matches(acl(op=Op.ALL))


def test_validate_filter():
    assert validate_filter(AclBindingFilter()) is None
    assert validate_filter(AclBindingFilter(RT.UNKNOWN)) == "Unknown patternFilter."
    assert validate_filter(AclBindingFilter(pattern_type=PT.UNKNOWN)) == "Unknown patternFilter."
    assert validate_filter(AclBindingFilter(operation=Op.UNKNOWN)) == "Unknown entryFilter."
    bad = AclBindingFilter(permission_type=AclPermissionType.UNKNOWN)
    assert validate_filter(bad) == "Unknown entryFilter." and bad.is_unknown
    assert not AclBindingFilter().is_unknown


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "message"),
    [
        (acl("t"), None),
        (acl("t", pt=PREFIXED), None),
        (acl("*", Op.ALL, principal=WILDCARD_PRINCIPAL), None),
        (acl("kafka-cluster", Op.IDEMPOTENT_WRITE, rt=CLUSTER), None),
        (acl("kafka-cluster", Op.ALL, rt=CLUSTER), None),
        (acl("u", Op.CREATE_TOKENS, rt=RT.USER), None),
        (acl("tx", Op.WRITE, rt=RT.TRANSACTIONAL_ID), None),
        (acl("t", principal="Group:ops"), None),
        (
            acl("my-cluster", Op.ALTER, rt=CLUSTER),
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
        (acl(""), "Invalid empty resource name"),
        (acl("t", rt=RT.ANY), "Invalid resourceType ANY"),
        (acl("t", rt=RT.UNKNOWN), "Invalid resourceType UNKNOWN"),
        (acl("t", pt=PT.MATCH), "Invalid patternType MATCH"),
        (acl("t", pt=PT.ANY), "Invalid patternType ANY"),
        (acl("t", Op.ANY), "Invalid operation ANY"),
        (acl("t", Op.UNKNOWN), "Invalid operation UNKNOWN"),
        (acl("t", perm=AclPermissionType.ANY), "Invalid permissionType ANY"),
        (
            acl("t", principal="alice"),
            "Could not parse principal from `alice` (no colon is present separating the "
            "principal type from the principal name)",
        ),
    ],
)
def test_validate_binding_messages(binding, message):
    assert validate_binding(binding) == message


@pytest.mark.parametrize(
    "binding",
    [
        acl("t", Op.IDEMPOTENT_WRITE),
        acl("t", Op.CLUSTER_ACTION),
        acl("g", Op.WRITE, rt=GROUP),
        acl("kafka-cluster", Op.READ, rt=CLUSTER),
        acl("tx", Op.READ, rt=RT.TRANSACTIONAL_ID),
        acl("tok", Op.READ, rt=RT.DELEGATION_TOKEN),
        acl("u", Op.READ, rt=RT.USER),
    ],
)
def test_validate_refuses_operation_the_resource_type_lacks(binding):
    message = validate_binding(binding)
    assert message is not None and "only supports operations" in message


def test_validate_supported_operations_everywhere():
    for rt, ops in SUPPORTED_OPERATIONS.items():
        name = "kafka-cluster" if rt is CLUSTER else "x"
        for op in AclOperation:
            message = validate_binding(acl(name, op, rt=rt))
            ok = op is Op.ALL or op in ops
            assert (message is None) is ok, (rt, op, message)


def test_validate_refuses_prefixed_wildcard():
    assert "PREFIXED" in validate_binding(acl("*", pt=PREFIXED))


# -- records -----------------------------------------------------------------------------

bindings = st.builds(
    acl,
    st.text(max_size=8),
    st.sampled_from(AclOperation),
    st.sampled_from(AclPermissionType),
    st.text(max_size=8),
    st.text(max_size=8),
    rt=st.sampled_from(ResourceType),
    pt=st.sampled_from(PatternType),
)


@given(bindings)
def test_record_round_trip_through_msgpack(binding):
    record = msgpack.unpackb(msgpack.packb(to_record(binding)))
    again = binding_from_record(record)
    assert again == binding
    assert type(again.pattern.resource_type) is ResourceType
    assert type(again.entry.operation) is AclOperation


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.pop("host"),
        lambda r: r.update(operation=99),
        lambda r: r.update(resource_type=-1),
        lambda r: r.update(name=5),
        lambda r: r.update(principal=None),
    ],
)
def test_bad_record_is_a_value_error(mutate):
    record = to_record(acl())
    mutate(record)
    with pytest.raises(ValueError):
        binding_from_record(record)
    with pytest.raises(ValueError):
        binding_from_record(None)  # type: ignore[arg-type]


# -- property: the index agrees with a naive scan ----------------------------------------

PRINCIPALS = ["User:alice", "User:bob", "User:*", "User:*", "Group:ops"]
HOSTS = ["h1", "*", "*"]
LITERAL_NAMES = ["a", "ab", "abc", "b", "*", "ba"]
PREFIXES = ["a", "ab", "abc", "b", "*", "abcd"]
ASKED_NAMES = ["a", "ab", "abc", "abd", "b", "*", "*a", "c", ""]
# dense on the operations that imply one another, where mistakes hide
OPERATIONS = [
    Op.ALL, Op.READ, Op.WRITE, Op.ALTER, Op.DELETE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS,
    Op.ALTER_CONFIGS, Op.CREATE,
]  # fmt: skip
TYPES = [TOPIC, TOPIC, TOPIC, GROUP]

universe_bindings = st.one_of(
    st.builds(
        acl,
        st.sampled_from(LITERAL_NAMES),
        st.sampled_from(OPERATIONS),
        st.sampled_from([ALLOW, DENY]),
        st.sampled_from(PRINCIPALS),
        st.sampled_from(HOSTS),
        rt=st.sampled_from(TYPES),
        pt=st.just(LITERAL),
    ),
    st.builds(
        acl,
        st.sampled_from(PREFIXES),
        st.sampled_from(OPERATIONS),
        st.sampled_from([ALLOW, DENY]),
        st.sampled_from(PRINCIPALS),
        st.sampled_from(HOSTS),
        rt=st.sampled_from(TYPES),
        pt=st.just(PREFIXED),
    ),
)
questions = st.tuples(
    st.sampled_from(["User:alice", "User:bob", "User:carol", "Group:ops"]),
    st.sampled_from(["h1", "h2"]),
    st.sampled_from(OPERATIONS),
    st.sampled_from(TYPES),
    st.sampled_from(ASKED_NAMES),
)


def naive_authorize(bindings, super_users, allow_if_none, principal, host, op, rt, name):
    """Kafka's rule written as plainly as possible: scan every binding."""
    if principal in super_users:
        return True

    def applies(p: ResourcePattern) -> bool:
        if p.resource_type != rt:
            return False
        if p.pattern_type == LITERAL:
            return p.name == name or p.name == "*"
        return p.pattern_type == PREFIXED and name.startswith(p.name)

    def matches(e: AccessControlEntry) -> bool:
        return e.principal in (principal, "User:*") and e.host in (host, "*")

    relevant = [b for b in bindings if applies(b.pattern)]
    if not relevant:
        return allow_if_none
    entries = [b.entry for b in relevant if matches(b.entry)]
    if any(e.permission_type == DENY and e.operation in (op, Op.ALL) for e in entries):
        return False
    implied = {
        Op.DESCRIBE: {Op.READ, Op.WRITE, Op.DELETE, Op.ALTER},
        Op.DESCRIBE_CONFIGS: {Op.ALTER_CONFIGS},
    }.get(op, set())
    return any(
        e.permission_type == ALLOW and (e.operation in (op, Op.ALL) or e.operation in implied)
        for e in entries
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(universe_bindings, max_size=24),
    st.data(),
    st.sets(st.sampled_from(["User:bob", "Group:ops"]), max_size=1),
    st.booleans(),
    st.lists(questions, min_size=1, max_size=40),
)
def test_authorize_matches_naive_scan(added, data, supers, allow_if_none, asked):
    auth = AclAuthorizer(super_users=supers, allow_everyone_if_no_acl_found=allow_if_none)
    for b in added:
        auth.add(b)
    removed = data.draw(st.lists(st.sampled_from(added), max_size=len(added))) if added else []
    for b in removed:
        auth.remove(b)
    kept = set(added) - set(removed)
    assert set(auth.bindings()) == kept
    # random questions, plus every operation asked of each binding's own resource and
    # principal, so the answers are dense in the cases where the rules interact
    targeted = [
        (
            "User:carol" if b.entry.principal == WILDCARD_PRINCIPAL else b.entry.principal,
            "h1",
            op,
            b.pattern.resource_type,
            name,
        )
        for b in kept
        for name in (b.pattern.name, b.pattern.name + "x")
        for op in set(OPERATIONS)
    ]
    caches = {}
    for principal, host, op, rt, name in [*asked, *targeted]:
        expected = naive_authorize(kept, supers, allow_if_none, principal, host, op, rt, name)
        assert auth.authorize(principal, host, op, rt, name) is expected
        cache = caches.setdefault((principal, host), AuthorizationCache(auth, principal, host))
        assert cache.authorize(op, rt, name) is expected
