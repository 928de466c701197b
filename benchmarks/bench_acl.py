"""What an ACL check costs on the request path (logmq/security/acl.py).

Builds an authorizer with 1,000 ACLs (literal per-topic grants, prefixed grants of
assorted lengths, a few wildcard and DENY entries) and times, best of five rounds:
a cold ``AclAuthorizer.authorize`` on a topic with ACLs, one on a topic no ACL names,
and ``AuthorizationCache.authorize`` on a topic already seen (the Produce/Fetch hot
path), against a bare dict lookup for scale. ``python benchmarks/bench_acl.py``.
"""

from __future__ import annotations

import timeit

from logmq.security.acl import (
    AccessControlEntry,
    AclAuthorizer,
    AclBinding,
    AclOperation,
    AclPermissionType,
    AuthorizationCache,
    PatternType,
    ResourcePattern,
    ResourceType,
)

TOPIC = ResourceType.TOPIC
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


def build(n: int = 1000) -> AclAuthorizer:
    auth = AclAuthorizer(allow_everyone_if_no_acl_found=False)
    i = 0
    while len(auth) < n:
        user = f"User:u{i % 50}"
        if i % 10 == 0:
            pattern = ResourcePattern(TOPIC, f"team{i % 37}-{'x' * (i % 9)}", PatternType.PREFIXED)
        else:
            pattern = ResourcePattern(TOPIC, f"orders-{i}", PatternType.LITERAL)
        op = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)[i % 3]
        perm = DENY if i % 97 == 0 else ALLOW
        auth.add(AclBinding(pattern, AccessControlEntry(user, "*", op, perm)))
        i += 1
    return auth


def best(stmt, number: int) -> float:
    """Nanoseconds per call, best of five rounds."""
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e9


def main() -> None:
    auth = build()
    principal, host = "User:u1", "10.0.0.7"
    write = AclOperation.WRITE
    cache = AuthorizationCache(auth, principal, host)
    cache.authorize(write, TOPIC, "orders-1")
    plain = {(write, TOPIC, "orders-1"): True}

    n = 200_000
    results = {
        "cold authorize, literal ACLs on topic": best(
            lambda: auth.authorize(principal, host, write, TOPIC, "orders-1"), n
        ),
        "cold authorize, prefixed match": best(
            lambda: auth.authorize(principal, host, write, TOPIC, "team3-xxxxevents"), n
        ),
        "cold authorize, no ACL applies": best(
            lambda: auth.authorize(principal, host, write, TOPIC, "unnamed"), n
        ),
        "cached authorize (hit)": best(lambda: cache.authorize(write, TOPIC, "orders-1"), n),
        "bare dict.get of the same key": best(lambda: plain.get((write, TOPIC, "orders-1")), n),
        "empty lambda call (overhead)": best(lambda: None, n),
    }
    print(f"{len(auth)} ACLs")
    for label, ns in results.items():
        print(f"{label:40s} {ns:8.0f} ns/call")


if __name__ == "__main__":
    main()
