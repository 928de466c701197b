from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logmq.security.sasl import (
    MECHANISMS,
    PlainServer,
    PlainUsers,
    SaslAuthenticationError,
    SaslSessionLifetime,
    UnsupportedSaslMechanismError,
    enabled_mechanisms,
    new_server,
    parse_jaas_config,
    parse_jaas_entries,
)
from logmq.security.scram import ScramCredential, ScramServer

KAFKA_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)


def plain(users: PlainUsers, msg: bytes) -> PlainServer:
    server = PlainServer(users.verify)
    assert server.step(msg) == b""
    return server


def test_plain_ok_and_authzid():
    users = PlainUsers.from_jaas(KAFKA_JAAS)
    s = plain(users, b"\0alice\0alice-secret")
    assert s.complete and s.username == "alice" and s.credential_expiry_ms is None
    assert plain(users, b"admin\0admin\0admin-secret").username == "admin"
    with pytest.raises(SaslAuthenticationError):
        s.step(b"\0alice\0alice-secret")  # one message per exchange


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (b"\0alice\0wrong", "Invalid username or password"),
        (b"\0nobody\0alice-secret", "Invalid username or password"),
        (b"admin\0alice\0alice-secret", "authorization id"),
        (b"\0alice", "3 tokens"),
        (b"\0alice\0pw\0extra", "3 tokens"),
        (b"\0\0pw", "username"),
        (b"\0alice\0", "password"),
        (b"\0alice\0\xff", "UTF-8"),
        (b"\0alice\0" + b"x" * 20000, "too long"),
    ],
)
def test_plain_failures(msg, match):
    server = PlainServer(PlainUsers.from_jaas(KAFKA_JAAS).verify)
    with pytest.raises(SaslAuthenticationError, match=match):
        server.step(msg)
    assert not server.complete and server.username is None


def test_unknown_user_and_wrong_password_same_message():
    users = PlainUsers({"alice": "pw"})
    msgs = []
    for m in (b"\0alice\0bad", b"\0bob\0bad"):
        with pytest.raises(SaslAuthenticationError) as e:
            PlainServer(users.verify).step(m)
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]


@given(
    name=st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=30),
    password=st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1),
)
def test_plain_round_trip(name, password):
    users = PlainUsers({name: password})
    msg = f"\0{name}\0{password}".encode()
    assert PlainServer(users).step(msg) == b""
    assert users.verify(name, password)
    assert not users.verify(name, password + "x")


def test_jaas_parsing():
    cfg = parse_jaas_config(KAFKA_JAAS)
    assert cfg.login_module == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert cfg.control_flag == "required"
    assert cfg.options == {
        "username": "admin",
        "password": "admin-secret",
        "user_admin": "admin-secret",
        "user_alice": "alice-secret",
    }
    cfg = parse_jaas_config(
        'a.b.C REQUIRED k1=unquoted k2="with \\"quotes\\" and \\\\ and ; and =" '
        'k3="tab\\there" k4="" /* note */ // line\n user_x=y;'
    )
    assert cfg.control_flag == "required"
    assert cfg.options == {
        "k1": "unquoted",
        "k2": 'with "quotes" and \\ and ; and =',
        "k3": "tab\there",
        "k4": "",
        "user_x": "y",
    }
    assert parse_jaas_config("M optional;").options == {}
    assert PlainUsers.from_jaas(parse_jaas_config('M required user_a="b" user_="x";')).verify(
        "a", "b"
    )
    for bad in (
        "",
        "M required k=v",  # no ';'
        "M mandatory k=v;",
        "M required k v;",
        'M required k="open;',
        "M required k=v; N required;",  # two modules in one sasl.jaas.config
        "M required =v;",
    ):
        with pytest.raises(ValueError):
            parse_jaas_config(bad)


def test_jaas_file_sections():
    text = """
    KafkaServer {
        org.apache.kafka.common.security.scram.ScramLoginModule required;
        org.apache.kafka.common.security.plain.PlainLoginModule required
            username="admin" password="admin-secret"
            user_admin="admin-secret"
            user_bob="b=b;b";
    };
    Client { x.Y optional; };
    """
    entries = parse_jaas_entries(text)
    assert [e.login_module.rsplit(".", 1)[1] for e in entries] == [
        "ScramLoginModule",
        "PlainLoginModule",
        "Y",
    ]


def test_users_file_formats(tmp_path):
    jaas = tmp_path / "jaas.conf"
    jaas.write_text(
        "KafkaServer {\n org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        ' user_admin="admin-secret" user_bob="b=b;b";\n};\n'
    )
    users = PlainUsers.from_file(jaas)
    assert users.verify("admin", "admin-secret") and users.verify("bob", "b=b;b")
    assert len(users) == 2

    prop = tmp_path / "jaas.txt"
    prop.write_text(KAFKA_JAAS + "\n")
    assert PlainUsers.from_file(prop).verify("alice", "alice-secret")

    lines = tmp_path / "users"
    lines.write_text("# logmq PLAIN users\n\nadmin = admin-secret\nalice=pa=ss word\n")
    users = PlainUsers.from_file(lines)
    assert users.verify("admin", "admin-secret")
    assert users.verify("alice", "pa=ss word")
    assert not users.verify("alice", "pa")
    assert "alice" in users and "nobody" not in users

    bad = tmp_path / "bad"
    bad.write_text("just-a-name\n")
    with pytest.raises(ValueError, match=":1:"):
        PlainUsers.from_file(bad)


def test_registry():
    users = PlainUsers({"a": "b"})
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pw")
    assert MECHANISMS == ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    assert enabled_mechanisms(plain_users=users) == ("PLAIN",)
    assert enabled_mechanisms(plain_users=users, scram_lookup={}.get) == MECHANISMS[:3]
    assert isinstance(new_server("PLAIN", plain_users=users), PlainServer)
    s = new_server("SCRAM-SHA-256", scram_lookup={"u": cred}.get)
    assert isinstance(s, ScramServer) and s.mechanism == "SCRAM-SHA-256"
    with pytest.raises(UnsupportedSaslMechanismError) as e:
        new_server("OAUTHBEARER", plain_users=users)
    assert e.value.enabled == ("PLAIN",) and "OAUTHBEARER" in str(e.value)
    with pytest.raises(UnsupportedSaslMechanismError):
        new_server("GSSAPI", plain_users=users)
    with pytest.raises(UnsupportedSaslMechanismError) as e:
        new_server("PLAIN", plain_users=users, scram_lookup={}.get, enabled=["SCRAM-SHA-512"])
    assert e.value.enabled == ("SCRAM-SHA-512",)


def test_session_lifetime():
    # neither limit: no re-authentication (lifetime 0 means "none" on the wire)
    s = SaslSessionLifetime.start(1_000)
    assert (s.session_lifetime_ms, s.expires_at_ms) == (0, None) and not s.expired(10**15)
    s = SaslSessionLifetime.start(1_000, max_reauth_ms=0)
    assert s.session_lifetime_ms == 0
    s = SaslSessionLifetime.start(1_000, max_reauth_ms=60_000)
    assert (s.session_lifetime_ms, s.expires_at_ms) == (60_000, 61_000)
    assert not s.expired(60_999) and s.expired(61_000)
    s = SaslSessionLifetime.start(1_000, credential_expiry_ms=31_000)
    assert s.session_lifetime_ms == 30_000
    s = SaslSessionLifetime.start(1_000, max_reauth_ms=60_000, credential_expiry_ms=31_000)
    assert s.session_lifetime_ms == 30_000
    s = SaslSessionLifetime.start(1_000, max_reauth_ms=10_000, credential_expiry_ms=31_000)
    assert s.session_lifetime_ms == 10_000
    s = SaslSessionLifetime.start(50_000, max_reauth_ms=10_000, credential_expiry_ms=31_000)
    assert s.session_lifetime_ms == 0 and s.expired(50_000)
