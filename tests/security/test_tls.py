"""TLS settings (Kafka's ssl.* names), principal mapping, handshakes and certificate reload."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from logmq.errors import InvalidConfigError
from logmq.security.tls import (
    CertificateReloader,
    NoMatchingRuleError,
    PrincipalMapper,
    TlsSettings,
    client_context,
    distinguished_name,
    listener_prefix,
    principal_from_peer_cert,
    server_context,
)
from logmq.testing.certs import CertificateAuthority, IssuedCertificate, make_ca, make_cert


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, IssuedCertificate, IssuedCertificate]:
    ca = make_ca(tmp_path)
    server = make_cert(ca, tmp_path, "localhost")
    client = make_cert(
        ca, tmp_path, "alice", server=False, organizational_unit="eng", organization="Acme"
    )
    return ca, server, client


def server_props(ca: CertificateAuthority, server: IssuedCertificate, auth: str = "none"):
    return {
        "ssl.keystore.location": str(server.keystore_path),
        "ssl.truststore.location": str(ca.cert_path),
        "ssl.client.auth": auth,
    }


# --------------------------------------------------------------------------- settings


def test_defaults_follow_kafka(pki):
    ca, server, _ = pki
    s = TlsSettings.from_properties(server_props(ca, server))
    assert s.client_auth == "none"
    assert s.enabled_protocols == ("TLSv1.2", "TLSv1.3")
    assert s.protocol == "TLSv1.3"
    assert s.endpoint_identification_algorithm == "https"
    assert s.principal_mapping_rules == "DEFAULT"
    assert s.watched_files == (str(server.keystore_path), str(ca.cert_path))


def test_listener_prefix_overrides_per_key(pki, tmp_path):
    ca, server, _ = pki
    other = make_cert(ca, tmp_path / "other", "broker-internal")
    props = server_props(ca, server, "requested")
    props["listener.name.internal.ssl.keystore.location"] = str(other.keystore_path)
    props["listener.name.internal.ssl.client.auth"] = "required"
    s = TlsSettings.from_properties(props, prefix=listener_prefix("INTERNAL"))
    assert s.keystore_location == str(other.keystore_path)
    assert s.client_auth == "required"
    assert s.truststore_location == str(ca.cert_path)  # falls back to the bare key
    assert TlsSettings.from_properties(props).client_auth == "requested"
    no_dot = TlsSettings.from_properties(props, prefix="listener.name.internal")
    assert no_dot == s


@pytest.mark.parametrize("store_type", ["JKS", "PKCS12", "jks"])
def test_jks_and_pkcs12_refused_with_conversion_hint(pki, store_type):
    ca, server, _ = pki
    for key in ("ssl.keystore.type", "ssl.truststore.type"):
        with pytest.raises(InvalidConfigError, match="PEM") as e:
            TlsSettings.from_properties({**server_props(ca, server), key: store_type})
        assert "openssl pkcs12" in str(e.value)


def test_prefixed_error_names_prefixed_key(pki):
    ca, server, _ = pki
    props = {**server_props(ca, server), "listener.name.ssl.ssl.keystore.type": "JKS"}
    with pytest.raises(InvalidConfigError, match=r"listener\.name\.ssl\.ssl\.keystore\.type"):
        TlsSettings.from_properties(props, prefix=listener_prefix("SSL"))


def test_missing_files(pki, tmp_path):
    ca, server, _ = pki
    for key in ("ssl.keystore.location", "ssl.truststore.location"):
        props = {**server_props(ca, server), key: str(tmp_path / "nope.pem")}
        with pytest.raises(InvalidConfigError, match="no such file"):
            TlsSettings.from_properties(props)


@pytest.mark.parametrize("value", ["true", "want", "need", "optional", "yes"])
def test_bad_client_auth(pki, value):
    ca, server, _ = pki
    with pytest.raises(InvalidConfigError, match="none, requested or required"):
        TlsSettings.from_properties(server_props(ca, server, value))


def test_client_auth_case_insensitive(pki):
    ca, server, _ = pki
    assert TlsSettings.from_properties(server_props(ca, server, "REQUIRED")).client_auth == (
        "required"
    )


@pytest.mark.parametrize(
    ("props", "match"),
    [
        ({"ssl.enabled.protocols": "TLSv1.1,TLSv1.2"}, "insecure"),
        ({"ssl.enabled.protocols": "TLSv9"}, "unknown protocol"),
        ({"ssl.protocol": "SSLv3"}, "expected"),
        ({"ssl.protocol": "TLSv1.2", "ssl.enabled.protocols": "TLSv1.3"}, "allows no"),
        ({"ssl.cipher.suites": "TLS_NOT_A_SUITE"}, "unknown or unsupported"),
        ({"ssl.endpoint.identification.algorithm": "ldap"}, "https or empty"),
        ({"ssl.principal.mapping.rules": "default"}, "invalid rule"),
        ({"ssl.keystore.password": "x"}, "ssl.key.password"),
        ({"ssl.truststore.password": "x"}, "PEM truststore"),
        ({"ssl.keystore.certificate.chain": "x"}, "not both"),
    ],
)
def test_bad_values(pki, props, match):
    ca, server, _ = pki
    with pytest.raises(InvalidConfigError, match=match):
        TlsSettings.from_properties({**server_props(ca, server), **props})


def test_inline_pem_needs_both_parts(pki):
    _, _, client = pki
    with pytest.raises(InvalidConfigError, match="both"):
        TlsSettings.from_properties({"ssl.keystore.certificate.chain": client.chain_pem})


def test_endpoint_identification_empty_disables_hostname_check(pki):
    ca, _, _ = pki
    props = {"ssl.truststore.location": str(ca.cert_path)}
    assert client_context(TlsSettings.from_properties(props)).check_hostname
    props["ssl.endpoint.identification.algorithm"] = ""
    s = TlsSettings.from_properties(props)
    assert s.endpoint_identification_algorithm == ""
    assert not client_context(s).check_hostname


def test_cipher_suites_java_names_translated(pki):
    ca, server, _ = pki
    props = {
        **server_props(ca, server),
        "ssl.cipher.suites": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,"
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,TLS_AES_128_GCM_SHA256",
        "ssl.protocol": "TLSv1.2",
    }
    ctx = server_context(TlsSettings.from_properties(props))
    names = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert names == {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-CHACHA20-POLY1305"}
    assert ctx.maximum_version == ssl.TLSVersion.TLSv1_2


def test_server_needs_keystore_and_client_auth_needs_truststore(pki):
    _, server, _ = pki
    with pytest.raises(InvalidConfigError, match="keystore"):
        server_context(TlsSettings.from_properties({}))
    props = {"ssl.keystore.location": str(server.keystore_path), "ssl.client.auth": "required"}
    with pytest.raises(InvalidConfigError, match="truststore"):
        server_context(TlsSettings.from_properties(props))


def test_encrypted_key_needs_password(tmp_path):
    ca = make_ca(tmp_path)
    server = make_cert(ca, tmp_path, "localhost", password="s3cret")
    assert "ENCRYPTED PRIVATE KEY" in server.key_pem
    props = {"ssl.keystore.location": str(server.keystore_path)}
    with pytest.raises(InvalidConfigError, match=r"ssl\.key\.password"):
        server_context(TlsSettings.from_properties({**props, "ssl.key.password": "wrong"}))
    server_context(TlsSettings.from_properties({**props, "ssl.key.password": "s3cret"}))


def test_inline_pems_flattened_like_a_properties_file(tmp_path):
    """Kafka accepts inline PEM with its line breaks removed; so do we."""
    ca = make_ca(tmp_path)
    server = make_cert(ca, tmp_path, "localhost", password="pw")

    def flat(pem: str) -> str:
        return " ".join(pem.split())

    s = TlsSettings.from_properties(
        {
            "ssl.keystore.certificate.chain": flat(server.chain_pem),
            "ssl.keystore.key": flat(server.key_pem),
            "ssl.key.password": "pw",
            "ssl.truststore.certificates": flat(ca.cert_path.read_text()),
        }
    )
    assert s.watched_files == ()
    server_context(s)
    client_context(s)
    with pytest.raises(InvalidConfigError, match="base64"):
        TlsSettings.from_properties(
            {
                "ssl.truststore.certificates": "-----BEGIN CERTIFICATE-----!!"
                "-----END CERTIFICATE-----"
            }
        )


# --------------------------------------------------------------------------- principal mapping
# Cases from Kafka's SslPrincipalMapperTest (the rule syntax's own tests).


@pytest.mark.parametrize(
    "rules",
    [
        "DEFAULT",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
        "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
        "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
        "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
    ],
)
def test_valid_rules(rules):
    PrincipalMapper(rules)


@pytest.mark.parametrize(
    "rules",
    [
        "default",
        "DEFAUL",
        "DEFAULT/L",
        "DEFAULT/U",
        "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
        "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
    ],
)
def test_invalid_rules(rules):
    with pytest.raises(ValueError):
        PrincipalMapper(rules)


def test_mapping_first_matching_rule_wins_with_case_flags():
    mapper = PrincipalMapper(
        ", ".join(
            [
                "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
                "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
                "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
                "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
                "DEFAULT",
            ]
        )
    )
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    # no RULE matches: DEFAULT gives the full DN
    dn = "OU=JavaSoft,O=Sun Microsystems,C=US"
    assert mapper.name(dn) == dn


def test_no_rule_and_no_default_fails_like_kafka():
    mapper = PrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/")
    with pytest.raises(NoMatchingRuleError):
        mapper.name("CN=x,OU=Other")
    with pytest.raises(NoMatchingRuleError):
        PrincipalMapper("").name("CN=x")


def test_no_case_flag_keeps_case_and_default_rules():
    assert PrincipalMapper("RULE:^CN=([^,]*).*$/$1/").name("CN=MiXeD,O=x") == "MiXeD"
    assert PrincipalMapper(None).name("CN=a,O=b") == "CN=a,O=b"
    assert PrincipalMapper().name("CN=a,O=b") == "CN=a,O=b"


@pytest.mark.parametrize(
    ("expected", "rules"),
    [
        ("[]", ""),
        ("[DEFAULT]", "DEFAULT"),
        ("[RULE:/]", "RULE://"),
        ("[RULE:/.*]", "RULE:/.*/"),
        ("[RULE:/.*/L]", "RULE:/.*/L"),
        ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
        ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
        ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
        ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
        (
            "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
            "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
        ),
        ("[]", ",   , , ,      , , ,   "),
        ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
        ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
        ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
        (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),
        (r"[RULE:\**\/+/*/L, RULE:\/*\**/**]", r"RULE:\**\/+/*/L,RULE:\/*\**/**/"),
        (
            r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, "
            r"RULE:, DEFAULT, /DEFAULT, DEFAULT]",
            r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,"
            r"RULE:, DEFAULT, /DEFAULT/,DEFAULT",
        ),
    ],
)
def test_rules_splitting(expected, rules):
    assert str(PrincipalMapper(rules)) == f"SslPrincipalMapper(rules = {expected})"


def test_comma_with_whitespace():
    mapper = PrincipalMapper(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz") == r"Tkac\, Adam"


def test_back_references_beyond_group_count_are_literal():
    # Kafka (after NiFi): with 1 group, $2 is a literal "$2" and $12 is group 1 then "2"
    mapper = PrincipalMapper("RULE:^CN=([^,]*).*$/$1@$2/")
    assert mapper.name("CN=bob,O=x") == "bob@$2"
    assert PrincipalMapper("RULE:^CN=([^,]*).*$/$12/").name("CN=bob,O=x") == "bob2"
    assert PrincipalMapper(r"RULE:^CN=([^,]*).*$/\$x-$1/").name("CN=bob") == "$x-bob"


def test_replacement_without_groups_is_refused_early():
    with pytest.raises(ValueError, match="no group"):
        PrincipalMapper("RULE:^CN=.*$/$1/")


def test_java_named_groups():
    mapper = PrincipalMapper("RULE:^CN=(?<user>[^,]*),OU=(?<unit>[^,]*).*$/${user}.${unit}/L")
    assert mapper.name("CN=Ann,OU=Ops,O=x") == "ann.ops"


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20))
def test_default_rule_is_identity(dn):
    assert PrincipalMapper("DEFAULT").name(dn) == dn


# --------------------------------------------------------------------------- DN printing


def _name_der(*attrs: tuple[x509.ObjectIdentifier, str]) -> bytes:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs]).public_bytes()


def test_dn_is_most_specific_first_like_java_and_rfc4514():
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
            x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
            x509.NameAttribute(NameOID.DOMAIN_COMPONENT, "example"),
        ]
    )
    expected = "DC=example,CN=alice,OU=eng,O=Acme,C=US"
    assert distinguished_name(name.public_bytes()) == expected
    # the same as cryptography's RFC 4514 printer for ordinary names
    assert name.rfc4514_string() == expected


def test_dn_escaping_follows_java_not_rfc4514():
    der = _name_der((NameOID.ORGANIZATION_NAME, "a=b#c, d"), (NameOID.COMMON_NAME, " x "))
    # Java escapes '=' and every '#', and leading/trailing spaces
    assert distinguished_name(der) == r"CN=\ x\ ,O=a\=b\#c\, d"


def test_dn_unknown_types_print_as_oid_and_hex_der():
    der = _name_der(
        (NameOID.EMAIL_ADDRESS, "a@b.c"),  # IA5String
        (NameOID.COMMON_NAME, "svc"),
    )
    assert distinguished_name(der) == "CN=svc,1.2.840.113549.1.9.1=#1605614062" + "2e63"


def test_dn_multi_valued_rdn_sorted_like_java():
    name = x509.Name(
        [
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "bob"),
                ]
            )
        ]
    )
    assert distinguished_name(name.public_bytes()) == "CN=bob+OU=ops"


def test_principal_from_cert(pki):
    _, _, client = pki
    der = client.certificate.public_bytes(encoding=_der())
    assert principal_from_peer_cert(der, PrincipalMapper()) == "User:CN=alice,OU=eng,O=Acme"
    cn_only = PrincipalMapper("RULE:^CN=([^,]*),.*$/$1/U,DEFAULT")
    assert principal_from_peer_cert(der, cn_only) == "User:ALICE"
    assert principal_from_peer_cert(None, cn_only) == "User:ANONYMOUS"
    assert principal_from_peer_cert(b"", cn_only) == "User:ANONYMOUS"


def _der():
    from cryptography.hazmat.primitives.serialization import Encoding

    return Encoding.DER


# --------------------------------------------------------------------------- handshakes

CN_RULES = "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT"


async def _serve(ctx: ssl.SSLContext, principals: asyncio.Queue):
    mapper = PrincipalMapper(CN_RULES)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        sslobj = writer.get_extra_info("ssl_object")
        der = sslobj.getpeercert(binary_form=True)
        principal = principal_from_peer_cert(der, mapper)
        await principals.put(principal)
        writer.write(principal.encode() + b"\n")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)


async def _connect(port: int, ctx: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
    )
    try:
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


def _client(ca: CertificateAuthority, cert: IssuedCertificate | None) -> ssl.SSLContext:
    props = {"ssl.truststore.location": str(ca.cert_path)}
    if cert is not None:
        props["ssl.keystore.location"] = str(cert.keystore_path)
    return client_context(TlsSettings.from_properties(props))


async def test_handshake_required_with_client_cert(pki):
    ca, server, client = pki
    ctx = server_context(TlsSettings.from_properties(server_props(ca, server, "required")))
    principals: asyncio.Queue = asyncio.Queue()
    srv = await _serve(ctx, principals)
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        assert await _connect(port, _client(ca, client)) == b"User:alice\n"
        assert principals.get_nowait() == "User:alice"


async def test_handshake_requested_without_cert_is_anonymous(pki):
    ca, server, client = pki
    ctx = server_context(TlsSettings.from_properties(server_props(ca, server, "requested")))
    principals: asyncio.Queue = asyncio.Queue()
    srv = await _serve(ctx, principals)
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        assert await _connect(port, _client(ca, None)) == b"User:ANONYMOUS\n"
        assert await _connect(port, _client(ca, client)) == b"User:alice\n"


async def test_handshake_required_without_cert_fails(pki):
    ca, server, _ = pki
    ctx = server_context(TlsSettings.from_properties(server_props(ca, server, "required")))
    principals: asyncio.Queue = asyncio.Queue()
    srv = await _serve(ctx, principals)
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        # TLS 1.3: the client learns of the rejection on its first read
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            line = await _connect(port, _client(ca, None))
            if not line:
                raise ConnectionError("closed")
        assert principals.empty()


async def test_handshake_client_cert_from_other_ca_rejected(pki, tmp_path):
    ca, server, _ = pki
    rogue_ca = make_ca(tmp_path / "rogue", "rogue-ca")
    rogue = make_cert(rogue_ca, tmp_path / "rogue", "alice", server=False)
    ctx = server_context(TlsSettings.from_properties(server_props(ca, server, "required")))
    principals: asyncio.Queue = asyncio.Queue()
    srv = await _serve(ctx, principals)
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            line = await _connect(port, _client(ca, rogue))
            if not line:
                raise ConnectionError("closed")
        assert principals.empty()


async def test_client_checks_hostname_unless_disabled(pki, tmp_path):
    ca, _, _ = pki
    wrong = make_cert(ca, tmp_path / "wrong", "elsewhere", sans=("example.invalid",))
    srv_ctx = server_context(TlsSettings.from_properties(server_props(ca, wrong)))
    srv = await _serve(srv_ctx, asyncio.Queue())
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        with pytest.raises(ssl.SSLCertVerificationError):
            await _connect(port, _client(ca, None))
        lax = client_context(
            TlsSettings.from_properties(
                {
                    "ssl.truststore.location": str(ca.cert_path),
                    "ssl.endpoint.identification.algorithm": "",
                }
            )
        )
        assert await _connect(port, lax) == b"User:ANONYMOUS\n"


# --------------------------------------------------------------------------- reloading


async def _served_cert(port: int, ca: CertificateAuthority) -> x509.Certificate:
    ctx = _client(ca, None)
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der)


def _bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


async def test_reload_serves_new_certificate_and_keeps_old_on_corruption(pki, tmp_path):
    ca, server, _ = pki
    settings = TlsSettings.from_properties(server_props(ca, server))
    reloader = CertificateReloader(settings)
    assert reloader.check() is None  # nothing changed

    current = {"ctx": reloader.context}
    srv = await asyncio.start_server(
        lambda r, w: w.close(), "127.0.0.1", 0, ssl=_DelegatingContext(current)
    )
    async with srv:
        port = srv.sockets[0].getsockname()[1]
        first = await _served_cert(port, ca)
        assert first.serial_number == server.certificate.serial_number

        # rotate: same file names, a new key and certificate
        rotated = make_cert(ca, tmp_path, "localhost")
        new_ctx = reloader.check()
        assert new_ctx is not None and new_ctx is reloader.context
        assert reloader.last_error is None and reloader.reloads == 1
        current["ctx"] = new_ctx
        second = await _served_cert(port, ca)
        assert second.serial_number == rotated.certificate.serial_number != first.serial_number

        # touched but unchanged: no rebuild
        _bump_mtime(server.keystore_path)
        assert reloader.check() is None and reloader.reloads == 1

        # half-written keystore: old context kept, error recorded, not retried
        text = server.keystore_path.read_text()
        server.keystore_path.write_text(text[: len(text) // 2])
        assert reloader.check() is None
        assert reloader.last_error is not None
        assert reloader.context is new_ctx
        assert reloader.check() is None

        # the writer finishes: picked up
        server.keystore_path.write_text(text)
        _bump_mtime(server.keystore_path)
        # same content as the loaded one: nothing to do, but no longer an error to report
        assert reloader.check() is None
        third = make_cert(ca, tmp_path, "localhost")
        assert reloader.check() is not None
        current["ctx"] = reloader.context
        assert (await _served_cert(port, ca)).serial_number == third.certificate.serial_number


def test_reload_truststore_and_missing_file(pki, tmp_path):
    ca, server, _ = pki
    reloader = CertificateReloader(
        TlsSettings.from_properties(server_props(ca, server, "required"))
    )
    ca.cert_path.write_text("not a certificate\n")
    assert reloader.check() is None and reloader.last_error is not None
    other = make_ca(tmp_path / "ca2")
    ca.cert_path.write_bytes(other.cert_path.read_bytes())
    assert reloader.check() is not None and reloader.last_error is None
    os.unlink(server.keystore_path)
    assert reloader.check() is None
    assert isinstance(reloader.last_error, FileNotFoundError)


def test_reload_inline_never(pki):
    _, server, _ = pki
    s = TlsSettings.from_properties(
        {
            "ssl.keystore.certificate.chain": server.chain_pem,
            "ssl.keystore.key": server.key_pem,
        }
    )
    reloader = CertificateReloader(s)
    assert reloader.check() is None


def test_reload_initial_failure_raises(tmp_path):
    ca = make_ca(tmp_path)
    a = make_cert(ca, tmp_path, "a")
    b = make_cert(ca, tmp_path, "b")
    mismatched = tmp_path / "mismatch.pem"
    mismatched.write_text(a.key_pem + b.chain_pem)
    s = TlsSettings.from_properties({"ssl.keystore.location": str(mismatched)})
    with pytest.raises(InvalidConfigError, match="cannot load keystore"):
        CertificateReloader(s)


class _DelegatingContext:
    """Stands in for the asyncio shell: new connections use whatever context is current."""

    def __init__(self, holder: dict):
        self._holder = holder

    def __getattr__(self, name):
        return getattr(self._holder["ctx"], name)


def test_certs_helper_layout(tmp_path):
    ca = make_ca(tmp_path, "my ca")
    assert ca.cert_path.name == "my_ca.crt"
    c = make_cert(ca, tmp_path, "bob", server=False, sans=())
    pem = c.keystore_path.read_text()
    assert pem.index("PRIVATE KEY") < pem.index("CERTIFICATE")
    assert pem.count("BEGIN CERTIFICATE") == 2
    with pytest.raises(x509.ExtensionNotFound):
        c.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    eku = c.certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u._name for u in eku] == ["clientAuth"]
    assert isinstance(c.private_key, ec.EllipticCurvePrivateKey)
    assert c.certificate.signature_hash_algorithm.name == hashes.SHA256().name
    assert oct(c.key_path.stat().st_mode & 0o777) == "0o600"


def test_handshake_on_uvloop(pki):
    """The broker runs on uvloop, whose TLS transport is its own implementation."""
    uvloop = pytest.importorskip("uvloop")
    ca, server, client = pki
    ctx = server_context(TlsSettings.from_properties(server_props(ca, server, "required")))

    async def main() -> tuple[bytes, bool]:
        srv = await _serve(ctx, asyncio.Queue())
        async with srv:
            port = srv.sockets[0].getsockname()[1]
            ok = await _connect(port, _client(ca, client))
            try:
                line = await _connect(port, _client(ca, None))
                refused = not line
            except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
                refused = True
            return ok, refused

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == (b"User:alice\n", True)
    finally:
        loop.close()
