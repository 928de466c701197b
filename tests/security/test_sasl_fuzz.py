"""Every SASL mechanism fed arbitrary client bytes at every step: it answers or raises
SaslAuthenticationError, nothing else (a stray exception would be the broker's fault,
answered UNKNOWN_SERVER_ERROR, and would leave the exchange in an unknown state).
LOGMQ_FUZZ_EXAMPLES runs more examples than CI does."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.security.sasl import PlainServer, PlainUsers, SaslAuthenticationError
from logmq.security.scram import ScramClient, ScramCredential, ScramServer

EXAMPLES = int(os.environ.get("LOGMQ_FUZZ_EXAMPLES", "0")) or 300
CRED = ScramCredential.from_password("SCRAM-SHA-256", "secret")


def lookup(name: str):
    return CRED if name == "alice" else None


def feed(server, messages: list[bytes]) -> None:
    for data in messages:
        try:
            server.step(data)
        except SaslAuthenticationError:
            return


def _scram_first() -> bytes:
    return ScramClient("SCRAM-SHA-256", "alice", "secret").first()


messages = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.builds(lambda b: _scram_first()[: len(b) % 60] + b, st.binary(max_size=40)),
        st.sampled_from([b"n,,n=alice,r=x", b"c=biws,r=x,p=AAAA", b"\x00alice\x00secret", b""]),
    ),
    max_size=4,
)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(messages)
def test_scram_takes_any_bytes(msgs):
    feed(ScramServer("SCRAM-SHA-256", lookup), msgs)


@settings(max_examples=EXAMPLES, deadline=None)
@given(messages)
def test_plain_takes_any_bytes(msgs):
    feed(PlainServer(PlainUsers({"alice": "secret"})), msgs)


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(messages)
def test_a_real_scram_exchange_cut_and_spliced_anywhere(msgs):
    client = ScramClient("SCRAM-SHA-256", "alice", "secret")
    server = ScramServer("SCRAM-SHA-256", lookup)
    first = server.step(client.first())
    final = client.final(first)
    feed(server, [final[: len(msgs)] + b"".join(msgs)])


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=300),
            st.builds(lambda t: b"n,,\x01auth=Bearer " + t + b"\x01\x01", st.binary(max_size=200)),
        ),
        max_size=3,
    )
)
def test_oauthbearer_takes_any_bytes(msgs):
    from logmq.security.oauthbearer import (
        JwksKeys,
        OAuthBearerConfig,
        OAuthBearerServer,
        OAuthBearerValidator,
    )

    validator = OAuthBearerValidator(OAuthBearerConfig(), JwksKeys.from_dict({"keys": []}))
    feed(OAuthBearerServer(validator), msgs)
