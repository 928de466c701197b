from __future__ import annotations

import base64

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logmq.security.sasl import SaslAuthenticationError
from logmq.security.scram import (
    ScramClient,
    ScramCredential,
    ScramServer,
    escape_username,
    parse_add_scram,
    unescape_username,
)

# RFC 7677, section 3.
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_CNONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SNONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
RFC_CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def rfc_server() -> ScramServer:
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    return ScramServer("SCRAM-SHA-256", {"user": cred}.get, nonce=lambda: RFC_SNONCE)


def test_rfc7677_vector_server():
    server = rfc_server()
    assert server.step(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert not server.complete
    assert server.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.complete and server.username == "user"
    assert server.credential_expiry_ms is None
    with pytest.raises(SaslAuthenticationError):
        server.step(b"again")


def test_rfc7677_vector_client():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CNONCE)
    assert client.first() == RFC_CLIENT_FIRST
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.verify(RFC_SERVER_FINAL)
    assert client.complete


def test_client_rejects_bad_server_signature():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CNONCE)
    client.first()
    client.final(RFC_SERVER_FIRST)
    with pytest.raises(SaslAuthenticationError):
        client.verify(b"v=" + base64.b64encode(b"\0" * 32))
    with pytest.raises(SaslAuthenticationError, match="boom"):
        client.verify(b"e=boom")


def test_client_rejects_nonce_not_extending_its_own():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_CNONCE)
    client.first()
    with pytest.raises(SaslAuthenticationError, match="nonce"):
        client.final(b"r=otherNonce123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(SaslAuthenticationError, match="iterations"):
        ScramClient("SCRAM-SHA-256", "u", "p", nonce="abc").final(b"r=abcdef,s=AAAA,i=100")


names = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=20)
passwords = st.text(st.characters(codec="utf-8"), max_size=20)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mechanism=st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]),
    name=names | st.sampled_from(["a,b", "a=b", "=2C", ",=,=", "=3D=2C"]),
    password=passwords | st.just("p,=ss=2C"),
)
def test_round_trip(mechanism, name, password):
    cred = ScramCredential.from_password(mechanism, password)
    server = ScramServer(mechanism, {name: cred}.get)
    client = ScramClient(mechanism, name, password)
    server_first = server.step(client.first())
    server_final = server.step(client.final(server_first))
    client.verify(server_final)
    assert server.complete and server.username == name
    assert unescape_username(escape_username(name)) == name


def run_failing(server: ScramServer, client: ScramClient) -> tuple[bytes, str]:
    server_first = server.step(client.first())
    with pytest.raises(SaslAuthenticationError) as exc:
        server.step(client.final(server_first))
    assert not server.complete and server.username is None
    return server_first, str(exc.value)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_wrong_password_and_unknown_user_look_the_same(mechanism):
    cred = ScramCredential.from_password(mechanism, "right")
    lookup = {"alice": cred}.get
    first_wrong, msg_wrong = run_failing(
        ScramServer(mechanism, lookup), ScramClient(mechanism, "alice", "wrong")
    )
    first_unknown, msg_unknown = run_failing(
        ScramServer(mechanism, lookup), ScramClient(mechanism, "mallory", "wrong")
    )
    assert msg_wrong == msg_unknown
    assert "alice" not in msg_wrong and "mallory" not in msg_unknown
    assert mechanism in msg_wrong

    def shape(server_first: bytes) -> tuple[int, str]:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        return len(base64.b64decode(attrs["s"])), attrs["i"]

    assert shape(first_wrong) == shape(first_unknown)
    # The decoy salt is stable per name: asking twice does not reveal it is made up.
    again, _ = run_failing(ScramServer(mechanism, lookup), ScramClient(mechanism, "mallory", "x"))
    assert again.split(b",")[1] == first_unknown.split(b",")[1]


def test_credential_of_other_mechanism_is_not_used():
    cred = ScramCredential.from_password("SCRAM-SHA-512", "pw")
    run_failing(
        ScramServer("SCRAM-SHA-256", {"u": cred}.get), ScramClient("SCRAM-SHA-256", "u", "pw")
    )


def test_tampered_nonce_and_channel_binding():
    server = rfc_server()
    server.step(RFC_CLIENT_FIRST)
    tampered = RFC_CLIENT_FINAL.replace(b"k0,p=", b"k1,p=")
    with pytest.raises(SaslAuthenticationError, match="nonce"):
        server.step(tampered)
    with pytest.raises(SaslAuthenticationError):  # a failed exchange stays failed
        server.step(RFC_CLIENT_FINAL)

    server = rfc_server()
    server.step(RFC_CLIENT_FIRST)
    with pytest.raises(SaslAuthenticationError, match="channel binding"):
        server.step(RFC_CLIENT_FINAL.replace(b"c=biws", b"c=eSws"))


def test_client_first_checks():
    def first(msg: bytes) -> None:
        rfc_server().step(msg)

    with pytest.raises(SaslAuthenticationError, match="channel binding"):
        first(b"p=tls-unique,,n=user,r=abc")
    with pytest.raises(SaslAuthenticationError, match="tokenauth"):
        first(b"n,,n=user,r=abc,tokenauth=true")
    with pytest.raises(SaslAuthenticationError, match="escape"):
        first(b"n,,n=us=er,r=abc")
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        first(b"n,a=admin,n=user,r=abc")
    with pytest.raises(SaslAuthenticationError, match="mandatory"):
        first(b"n,,m=x,n=user,r=abc")
    with pytest.raises(SaslAuthenticationError):
        first(b"n,,n=user")
    with pytest.raises(SaslAuthenticationError):
        first(b"n,,n=user,r=" + b"x" * 5000)
    with pytest.raises(SaslAuthenticationError):
        first(b"\xff\xfe")
    # 'y' (client supports binding, thinks the server does not) and a matching authzid pass,
    # as do unknown optional extensions.
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", {"user": cred}.get, nonce=lambda: "srv")
    assert server.step(b"y,a=user,n=user,r=abc,foo=bar").startswith(b"r=abcsrv,")


def test_y_flag_round_trip_uses_its_own_cbind():
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", {"u": cred}.get)
    client = ScramClient("SCRAM-SHA-256", "u", "pw", nonce="cn")
    server_first = server.step(b"y,,n=u,r=cn")
    final = client.final(server_first)  # c=biws, but the header was "y,,"
    with pytest.raises(SaslAuthenticationError, match="channel binding"):
        server.step(final)


def test_credential_validation_and_record():
    cred = ScramCredential.from_password("SCRAM-SHA-512", "pw", iterations=8192)
    assert repr(cred.stored_key) not in repr(cred) and repr(cred.server_key) not in repr(cred)
    record = cred.to_record()
    assert "pw" not in str(record)
    assert ScramCredential.from_record(msgpack.unpackb(msgpack.packb(record))) == cred
    for bad in (4095, 16385):
        with pytest.raises(ValueError, match="iterations"):
            ScramCredential.from_password("SCRAM-SHA-256", "pw", iterations=bad)
    with pytest.raises(ValueError, match="mechanism"):
        ScramCredential.from_password("SCRAM-SHA-1", "pw")
    with pytest.raises(ValueError):
        ScramCredential.from_record({"mechanism": "SCRAM-SHA-256"})


def test_parse_add_scram():
    mech, name, cred = parse_add_scram("SCRAM-SHA-512=[name=admin,password=secret]")
    assert (mech, name, cred.iterations) == ("SCRAM-SHA-512", "admin", 4096)
    _check_login(cred, "admin", "secret")

    mech, name, cred = parse_add_scram(
        'SCRAM-SHA-256=[name=alice,iterations=8192,salt="W22ZaJ0SNY7soEsUEjb6gQ==",'
        'password="pa,ss\\"word"]'
    )
    assert (mech, name, cred.iterations, cred.salt) == ("SCRAM-SHA-256", "alice", 8192, RFC_SALT)
    _check_login(cred, "alice", 'pa,ss"word')

    # saltedpassword= (the base64 SaltedPassword) gives the same credential as password=.
    import hashlib

    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    spec = (
        "SCRAM-SHA-256=[name=user,salt=W22ZaJ0SNY7soEsUEjb6gQ==,"
        f"saltedpassword={base64.b64encode(salted).decode()}]"
    )
    assert parse_add_scram(spec)[2] == ScramCredential.from_password(
        "SCRAM-SHA-256", "pencil", 4096, RFC_SALT
    )

    for bad in (
        "SCRAM-SHA-1=[name=a,password=b]",
        "SCRAM-SHA-256=[password=b]",
        "SCRAM-SHA-256=[name=a]",
        "SCRAM-SHA-256=[name=a,password=b,iterations=100]",
        "SCRAM-SHA-256=[name=a,password=b,colour=red]",
        "SCRAM-SHA-256=[name=a,saltedpassword=AAAA]",
        "SCRAM-SHA-256=[name=a,password=b,salt=!!]",
        "SCRAM-SHA-256 name=a,password=b",
    ):
        with pytest.raises(ValueError):
            parse_add_scram(bad)


def _check_login(cred: ScramCredential, name: str, password: str) -> None:
    server = ScramServer(cred.mechanism, {name: cred}.get)
    client = ScramClient(cred.mechanism, name, password)
    client.verify(server.step(client.final(server.step(client.first()))))
    assert server.username == name


def _kafka_python_scram():
    try:
        from kafka.net.sasl.scram import ScramClient as KafkaScramClient
    except ImportError:
        try:
            from kafka.sasl.scram import ScramClient as KafkaScramClient
        except ImportError:
            pytest.skip("kafka-python has no SCRAM client module here")
    return KafkaScramClient


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_client_interop(mechanism):
    """kafka-python's own SCRAM client code, driven against our server."""
    kafka_client_cls = _kafka_python_scram()
    cred = ScramCredential.from_password(mechanism, "s3cret", iterations=8192)
    server = ScramServer(mechanism, {"alice": cred}.get)
    client = kafka_client_cls("alice", "s3cret", mechanism)
    server_first = server.step(client.first_message())
    client.process_server_first_message(server_first)
    server_final = server.step(client.final_message())
    client.process_server_final_message(server_final)  # raises if our signature is wrong
    assert server.complete and server.username == "alice"

    bad = kafka_client_cls("alice", "nope", mechanism)
    server = ScramServer(mechanism, {"alice": cred}.get)
    bad.process_server_first_message(server.step(bad.first_message()))
    with pytest.raises(SaslAuthenticationError):
        server.step(bad.final_message())


# -- the client-final nonce: librdkafka before 2.6.1 repeats its own nonce ----------------

_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def _final_with_nonce(
    mechanism: str, password: str, bare: str, server_first: bytes, nonce: str, proof_nonce=None
) -> bytes:
    """A client-final message carrying ``nonce``, its proof computed (RFC 5802 from the
    primitives, not ScramClient) over the client-final-without-proof with ``proof_nonce``
    (by default the one sent), as librdkafka's client does."""
    import hashlib
    import hmac

    name = _HASH[mechanism]
    attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        name, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.new(salted, b"Client Key", name).digest()
    stored_key = hashlib.new(name, client_key).digest()
    signed = f"{bare},{server_first.decode()},c=biws,r={proof_nonce or nonce}".encode()
    signature = hmac.new(stored_key, signed, name).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"c=biws,r={nonce},p={base64.b64encode(proof).decode()}".encode()


def _exchange(mechanism: str, strict: bool = False):
    cred = ScramCredential.from_password(mechanism, "pw")
    server = ScramServer(mechanism, {"u": cred}.get, nonce=lambda: "SRVnonce", strict_nonce=strict)
    bare = "n=u,r=CLInonce"
    server_first = server.step(f"n,,{bare}".encode())
    assert server_first.startswith(b"r=CLInonceSRVnonce,")
    return server, bare, server_first


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_repeated_client_nonce_is_accepted_by_default(mechanism):
    """librdkafka < 2.6.1 sends r=<cnonce><cnonce><snonce> and signs that: Kafka 3.9's
    endsWith passes it, and so do we; the server signature covers the same bytes."""
    server, bare, server_first = _exchange(mechanism)
    doubled = "CLInonce" + "CLInonceSRVnonce"
    final = _final_with_nonce(mechanism, "pw", bare, server_first, doubled)
    server_final = server.step(final)
    assert server.complete and server.username == "u"
    # the server's proof is over the message as sent (a client checking it with the
    # doubled form, as librdkafka does, verifies it)
    import hashlib
    import hmac

    name = _HASH[mechanism]
    attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(name, b"pw", base64.b64decode(attrs["s"]), int(attrs["i"]))
    server_key = hmac.new(salted, b"Server Key", name).digest()
    signed = f"{bare},{server_first.decode()},c=biws,r={doubled}".encode()
    assert server_final == b"v=" + base64.b64encode(hmac.new(server_key, signed, name).digest())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_final_nonce_without_the_server_part_is_refused(mechanism):
    """The tolerant form still needs the server's fresh nonce at its end: a replayed or
    made-up final message fails, whatever its proof."""
    for nonce in (
        "CLInonce",  # the client nonce only
        "CLInonceCLInonce",  # the client nonce twice, no server part
        "CLInonceSRVnonc",  # the server part cut short
        "CLInonceSRVnonceX",  # something after it
        "CLInonceOTHERnonce",  # another exchange's server nonce
        "SRVnonce",  # the server part without the client's
    ):
        server, bare, server_first = _exchange(mechanism)
        final = _final_with_nonce(mechanism, "pw", bare, server_first, nonce)
        with pytest.raises(SaslAuthenticationError, match="nonce mismatch"):
            server.step(final)
        assert not server.complete


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_strict_nonce_refuses_the_repeated_form_and_takes_the_exact_one(mechanism):
    server, bare, server_first = _exchange(mechanism, strict=True)
    doubled = _final_with_nonce(mechanism, "pw", bare, server_first, "CLInonceCLInonceSRVnonce")
    with pytest.raises(SaslAuthenticationError, match=r"sasl\.scram\.strict\.nonce"):
        server.step(doubled)
    server, bare, server_first = _exchange(mechanism, strict=True)
    server.step(_final_with_nonce(mechanism, "pw", bare, server_first, "CLInonceSRVnonce"))
    assert server.complete
    # and the RFC 7677 vector, a standard client, in strict mode
    cred = ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    rfc = ScramServer(
        "SCRAM-SHA-256", {"user": cred}.get, nonce=lambda: RFC_SNONCE, strict_nonce=True
    )
    rfc.step(RFC_CLIENT_FIRST)
    assert rfc.step(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_proof_is_checked_over_the_bytes_the_client_sent(mechanism):
    """A proof over the canonical nonce does not pass with the repeated one on the wire,
    nor the reverse: the AuthMessage is the client-final-without-proof as received."""
    server, bare, server_first = _exchange(mechanism)
    final = _final_with_nonce(
        mechanism, "pw", bare, server_first, "CLInonceCLInonceSRVnonce", "CLInonceSRVnonce"
    )
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.step(final)
    server, bare, server_first = _exchange(mechanism)
    final = _final_with_nonce(
        mechanism, "pw", bare, server_first, "CLInonceSRVnonce", "CLInonceCLInonceSRVnonce"
    )
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.step(final)
    # a wrong password with the repeated nonce fails like any wrong password
    server, bare, server_first = _exchange(mechanism)
    final = _final_with_nonce(mechanism, "nope", bare, server_first, "CLInonceCLInonceSRVnonce")
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        server.step(final)


def test_strict_nonce_is_a_listener_setting():
    """``sasl.scram.strict.nonce`` (logmq's own), bare or with a listener's prefix."""
    from logmq.errors import InvalidConfigError
    from logmq.security.settings import SecuritySettings

    def settings(**props):
        base = {
            "listeners": "SASL_PLAINTEXT://127.0.0.1:0,OTHER://127.0.0.1:0",
            "listener.security.protocol.map": "OTHER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
        }
        return SecuritySettings.from_properties(
            {**base, **props}, native=("127.0.0.1", 0), kafka=None
        )

    def strict(s):
        return (s.of("SASL_PLAINTEXT").scram_strict_nonce, s.of("OTHER").scram_strict_nonce)

    assert strict(settings()) == (False, False)
    assert strict(settings(**{"sasl.scram.strict.nonce": "true"})) == (True, True)
    assert strict(
        settings(
            **{
                "sasl.scram.strict.nonce": "true",
                "listener.name.other.sasl.scram.strict.nonce": "false",
            }
        )
    ) == (True, False)
    with pytest.raises(InvalidConfigError, match=r"sasl\.scram\.strict\.nonce"):
        settings(**{"sasl.scram.strict.nonce": "yes"})


def test_add_scram_user_knows_its_own_password_under_another_salt():
    """A stored credential made from the same password (another broker's salt, or the
    first start's) is the option's; another password or another mechanism is not."""
    from logmq.security.scram import parse_add_scram_user

    user = parse_add_scram_user("SCRAM-SHA-512=[name=admin,password=secret]")
    assert user.name == "admin" and user.mechanism == "SCRAM-SHA-512"
    assert "secret" not in repr(user)
    assert user.same_secret(user.credential)
    assert user.same_secret(ScramCredential.from_password("SCRAM-SHA-512", "secret", 8192))
    assert not user.same_secret(ScramCredential.from_password("SCRAM-SHA-512", "other"))
    assert not user.same_secret(ScramCredential.from_password("SCRAM-SHA-256", "secret"))
    import hashlib

    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", RFC_SALT, 4096)
    spec = (
        "SCRAM-SHA-256=[name=user,salt=W22ZaJ0SNY7soEsUEjb6gQ==,"
        f"saltedpassword={base64.b64encode(salted).decode()}]"
    )
    from_salted = parse_add_scram_user(spec)
    assert from_salted.same_secret(
        ScramCredential.from_password("SCRAM-SHA-256", "pencil", 4096, RFC_SALT)
    )
    assert not from_salted.same_secret(ScramCredential.from_password("SCRAM-SHA-256", "pencil"))
