from __future__ import annotations

import json

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from logmq.security.oauthbearer import (
    INVALID_TOKEN,
    JwksKeys,
    OAuthBearerConfig,
    OAuthBearerServer,
    OAuthBearerValidationError,
    OAuthBearerValidator,
    fetch_jwks,
    parse_initial_response,
    read_jwks,
)
from logmq.security.sasl import SaslAuthenticationError, SaslSessionLifetime, new_server

NOW = 1_800_000_000
ISS = "https://idp.example/realms/kafka"
AUD = "logmq"


@pytest.fixture(scope="module")
def keys():
    return {
        "rsa": rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ec": ec.generate_private_key(ec.SECP256R1()),
        "other": rsa.generate_private_key(public_exponent=65537, key_size=2048),
    }


def jwk(public_key, kid, alg=None) -> dict:
    if isinstance(public_key, rsa.RSAPublicKey):
        d = json.loads(RSAAlgorithm.to_jwk(public_key))
    else:
        d = json.loads(ECAlgorithm.to_jwk(public_key))
    d["kid"] = kid
    d["use"] = "sig"
    if alg:
        d["alg"] = alg
    return d


@pytest.fixture(scope="module")
def jwks_path(keys, tmp_path_factory):
    doc = {
        "keys": [
            jwk(keys["rsa"].public_key(), "rsa-1"),
            jwk(keys["ec"].public_key(), "ec-1", "ES256"),
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},  # must never be used
        ]
    }
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps(doc))
    return path


def config(**kw) -> OAuthBearerConfig:
    base = {"expected_audience": (AUD,), "expected_issuer": ISS}
    base.update(kw)
    return OAuthBearerConfig(**base)


def token(key, alg="RS256", kid="rsa-1", **claims) -> str:
    body = {"sub": "alice", "iss": ISS, "aud": AUD, "iat": NOW - 10, "exp": NOW + 3600}
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    headers = {} if kid is None else {"kid": kid}
    return jwt.encode(body, key, algorithm=alg, headers=headers)


def initial(tok: str, authzid: str = "", ext: str = "") -> bytes:
    a = f"a={authzid}" if authzid else ""
    return f"n,{a},\x01auth=Bearer {tok}\x01{ext}\x01".encode()


def server(jwks_path, cfg=None) -> OAuthBearerServer:
    validator = OAuthBearerValidator(cfg or config(), read_jwks(jwks_path))
    return OAuthBearerServer(validator, clock=lambda: NOW)


def authenticate(jwks_path, tok, cfg=None, **kw) -> OAuthBearerServer:
    s = server(jwks_path, cfg)
    assert s.step(initial(tok, **kw)) == b""
    return s


def refused(jwks_path, tok, cfg=None, reason=None) -> OAuthBearerServer:
    s = server(jwks_path, cfg)
    assert s.step(initial(tok)) == INVALID_TOKEN == b'{"status":"invalid_token"}'
    assert not s.complete
    if reason:
        assert reason.lower() in str(s.failure).lower()
    with pytest.raises(SaslAuthenticationError, match="invalid_token"):
        s.step(b"\x01")
    return s


@pytest.mark.parametrize(
    ("key", "alg", "kid"),
    [
        ("rsa", "RS256", "rsa-1"),
        ("rsa", "RS384", "rsa-1"),
        ("rsa", "RS512", "rsa-1"),
        ("rsa", "PS256", "rsa-1"),
        ("ec", "ES256", "ec-1"),
    ],
)
def test_good_token(keys, jwks_path, key, alg, kid):
    tok = token(keys[key], alg, kid, scope="produce consume")
    s = authenticate(jwks_path, tok, ext="traceId=abc 123\x01")
    assert s.complete and s.username == "alice"
    assert s.credential_expiry_ms == (NOW + 3600) * 1000
    assert s.token is not None and s.token.scope == frozenset({"produce", "consume"})
    assert s.token.start_ms == (NOW - 10) * 1000
    assert s.extensions == {"traceId": "abc 123"}
    life = SaslSessionLifetime.start(NOW * 1000, 600_000, s.credential_expiry_ms)
    assert life.session_lifetime_ms == 600_000
    with pytest.raises(SaslAuthenticationError):
        s.step(b"\x01")


def test_principal_claim_scope_list_and_authzid(keys, jwks_path):
    cfg = config(sub_claim_name="preferred_username", scope_claim_name="scp")
    tok = token(keys["rsa"], preferred_username="bob", scp=["a", "b"])
    s = authenticate(jwks_path, tok, cfg, authzid="bob")
    assert s.username == "bob" and s.token.scope == frozenset({"a", "b"})
    s = server(jwks_path, cfg)
    with pytest.raises(SaslAuthenticationError, match="authorization id"):
        s.step(initial(tok, authzid="alice"))
    refused(jwks_path, token(keys["rsa"]), cfg, "preferred_username")


def test_no_kid_uses_the_only_fitting_key(keys, jwks_path):
    s = authenticate(jwks_path, token(keys["ec"], "ES256", kid=None))
    assert s.username == "alice"


def test_time_claims_with_skew(keys, jwks_path):
    authenticate(jwks_path, token(keys["rsa"], exp=NOW - 20))  # within the 30 s default skew
    refused(jwks_path, token(keys["rsa"], exp=NOW - 31), reason="expired")
    refused(jwks_path, token(keys["rsa"], exp=NOW - 5), config(clock_skew_seconds=0), "expired")
    refused(jwks_path, token(keys["rsa"], exp=None), reason="exp")
    refused(jwks_path, token(keys["rsa"], nbf=NOW + 120), reason="not valid before")
    authenticate(jwks_path, token(keys["rsa"], nbf=NOW + 10))


def test_audience_and_issuer(keys, jwks_path):
    refused(jwks_path, token(keys["rsa"], aud="someone-else"), reason="audience")
    refused(jwks_path, token(keys["rsa"], iss="https://evil.example"), reason="ssuer")
    refused(jwks_path, token(keys["rsa"], aud=None), reason="aud")
    authenticate(jwks_path, token(keys["rsa"], aud=["x", AUD]))
    # neither configured: not checked
    authenticate(jwks_path, token(keys["rsa"], aud="any", iss="any"), OAuthBearerConfig())


def test_wrong_key_alg_none_unknown_kid(keys, jwks_path):
    refused(jwks_path, token(keys["other"], kid="rsa-1"), reason="signature")
    refused(jwks_path, token(keys["other"], kid="nope"), reason="kid")
    s = refused(jwks_path, token(keys["rsa"], kid="nope"))
    assert s.failure.unknown_kid
    none_tok = jwt.encode({"sub": "alice", "exp": NOW + 60}, None, algorithm="none")
    refused(jwks_path, none_tok, reason="not allowed")
    hs = jwt.encode(
        {"sub": "alice", "exp": NOW + 60},
        "a-shared-secret-of-at-least-32-bytes",
        "HS256",
        {"kid": "hmac"},
    )
    refused(jwks_path, hs, reason="not allowed")
    refused(jwks_path, token(keys["ec"], "ES256", kid="rsa-1"), reason="does not fit")
    refused(jwks_path, "not.a.jwt", reason="malformed")


def test_key_rotation(keys, jwks_path, tmp_path):
    s = server(jwks_path)
    tok = token(keys["other"], kid="rsa-2")
    assert s.step(initial(tok)) == INVALID_TOKEN and s.failure.unknown_kid
    rotated = tmp_path / "rotated.json"
    rotated.write_text(json.dumps({"keys": [jwk(keys["other"].public_key(), "rsa-2", "RS256")]}))
    validator = OAuthBearerValidator(config(), read_jwks(jwks_path))
    validator.update_keys(fetch_jwks(rotated.as_uri()))  # file: URL, no network
    assert validator.validate(tok, NOW).principal == "alice"


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"n,,auth=Bearer x\x01\x01",
        b"n,,\x01auth=Bearer abc\x01",
        b"n,,\x01auth=Basic abc\x01\x01",
        b"n,,\x01auth=Bearer\x01\x01",
        b"n,,\x01foo=bar\x01\x01",
        b"n,,\x01auth=Bearer a\x01auth=Bearer b\x01\x01",
        b"n,,\x01auth=Bearer a\x01k3y=v\x01\x01",
        b"p=tls-server-end-point,,\x01auth=Bearer a\x01\x01",
        b"n,x=1,\x01auth=Bearer a\x01\x01",
        b"n,,\x01auth=Bearer \xff\x01\x01",
        b"n,,\x01auth=Bearer " + b"a" * 70000 + b"\x01\x01",
    ],
)
def test_malformed_framing(jwks_path, raw):
    s = server(jwks_path)
    with pytest.raises(SaslAuthenticationError):
        s.step(raw)
    assert not s.complete


def test_parse_initial_response():
    r = parse_initial_response(b"n,a=al=2Cice,\x01auth=bearer tok.en.x\x01host=h\x01\x01")
    assert (r.authzid, r.token, r.extensions) == ("al,ice", "tok.en.x", {"host": "h"})


def test_jwks_and_config_loading(keys, jwks_path):
    ks = read_jwks(jwks_path)
    assert len(ks) == 2 and set(ks.kids) == {"rsa-1", "ec-1"}  # the oct key is ignored
    with pytest.raises(ValueError):
        JwksKeys.from_json("{}")
    with pytest.raises(ValueError):
        JwksKeys.from_json("nope")
    cfg = OAuthBearerConfig.from_kafka_config(
        {
            "sasl.oauthbearer.jwks.endpoint.url": jwks_path.as_uri(),
            "sasl.oauthbearer.expected.audience": "logmq, other",
            "sasl.oauthbearer.expected.issuer": ISS,
            "listener.name.sasl_plaintext.oauthbearer.sasl.oauthbearer.clock.skew.seconds": "5",
            "sasl.oauthbearer.clock.skew.seconds": "60",
        },
        prefix="listener.name.sasl_plaintext.oauthbearer.",
    )
    assert cfg.expected_audience == ("logmq", "other") and cfg.clock_skew_seconds == 5
    assert (cfg.sub_claim_name, cfg.scope_claim_name) == ("sub", "scope")
    validator = OAuthBearerValidator.from_config(cfg)
    assert validator.validate(token(keys["rsa"]), NOW).principal == "alice"
    with pytest.raises(OAuthBearerValidationError):
        validator.validate(token(keys["rsa"]), NOW + 7200)
    with pytest.raises(ValueError, match="fetch_jwks"):
        OAuthBearerValidator.from_config(OAuthBearerConfig(jwks_endpoint_url="https://x/jwks"))
    s = new_server("OAUTHBEARER", oauth_validator=validator, clock=lambda: NOW)
    assert s.step(initial(token(keys["rsa"]))) == b"" and s.username == "alice"
