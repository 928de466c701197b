"""Throwaway PKI for tests: a CA and the certificates it signs, written as PEM files.

Brokers and clients under test need real certificates (TLS handshakes, principals taken
from the client certificate's subject), and checked-in certificates expire; so tests make
their own. Keys are ECDSA P-256: generating one takes microseconds, unlike RSA.

Each issued certificate is written three ways, matching what ``logmq.security.tls`` reads:
the certificate chain (leaf then CA), the PKCS#8 private key (encrypted when a password is
given, as Kafka's ``ssl.key.password`` expects), and both in one file, the form Kafka's PEM
``ssl.keystore.location`` takes.

Unlike the rest of ``logmq.testing`` this module needs ``cryptography``; it is imported
only by tests that ask for it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CertificateAuthority", "IssuedCertificate", "make_ca", "make_cert"]


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA; ``cert_path`` is the PEM truststore for peers that trust it."""

    name: str
    cert_path: Path
    key_path: Path
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey


@dataclass(frozen=True)
class IssuedCertificate:
    """A leaf certificate and where its files are.

    ``chain_path``: leaf then CA certificate (PEM). ``key_path``: the PKCS#8 key (PEM,
    encrypted when ``password`` is set). ``keystore_path``: key followed by the chain, the
    layout of a Kafka PEM keystore file (``ssl.keystore.location``).
    """

    common_name: str
    chain_path: Path
    key_path: Path
    keystore_path: Path
    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey
    password: str | None = None

    @property
    def chain_pem(self) -> str:
        return self.chain_path.read_text()

    @property
    def key_pem(self) -> str:
        return self.key_path.read_text()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write via a temp file and rename, so a reader never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _stem(common_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", common_name) or "cert"


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(
    dir: str | os.PathLike[str], name: str = "logmq-test-ca", *, days: int = 30
) -> CertificateAuthority:
    """Create a self-signed CA in ``dir`` (``<name>.crt``, ``<name>.key``)."""
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    stem = _stem(name)
    cert_path, key_path = d / f"{stem}.crt", d / f"{stem}.key"
    _write(cert_path, _cert_pem(cert))
    _write(key_path, _key_pem(key, None), private=True)
    return CertificateAuthority(name, cert_path, key_path, cert, key)


def _san(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for n in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            out.append(x509.DNSName(n))
    return out


def make_cert(
    ca: CertificateAuthority,
    dir: str | os.PathLike[str],
    common_name: str,
    *,
    server: bool = True,
    sans: Iterable[str] = ("127.0.0.1", "localhost"),
    days: int = 30,
    password: str | None = None,
    organizational_unit: str | None = None,
    organization: str | None = None,
    country: str | None = None,
    file_stem: str | None = None,
    not_valid_before: datetime.datetime | None = None,
) -> IssuedCertificate:
    """Issue a certificate for ``common_name`` signed by ``ca`` and write its files.

    ``server=True`` gives a broker certificate (serverAuth and clientAuth, since a broker
    is also a client of the other brokers); ``server=False`` a client one (clientAuth).
    The subject is built most significant first (C, O, OU, CN), so its RFC 2253 form is
    ``CN=...,OU=...,O=...,C=...``. Files are ``<stem>.crt`` (chain), ``<stem>.key`` and
    ``<stem>.keystore.pem``; an existing set is replaced atomically (reload tests rely on it).
    """
    d = Path(dir)
    d.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = []
    if country:
        attrs.append(x509.NameAttribute(NameOID.COUNTRY_NAME, country))
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    if organizational_unit:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, organizational_unit))
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    now = _now()
    start = not_valid_before or now - datetime.timedelta(minutes=5)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.private_key.public_key()),
            critical=False,
        )
    )
    san = _san(sans)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(ca.private_key, hashes.SHA256())
    stem = file_stem or _stem(common_name)
    chain = _cert_pem(cert) + _cert_pem(ca.certificate)
    key_pem = _key_pem(key, password)
    chain_path = d / f"{stem}.crt"
    key_path = d / f"{stem}.key"
    keystore_path = d / f"{stem}.keystore.pem"
    _write(chain_path, chain)
    _write(key_path, key_pem, private=True)
    _write(keystore_path, key_pem + chain, private=True)
    return IssuedCertificate(common_name, chain_path, key_path, keystore_path, cert, key, password)
