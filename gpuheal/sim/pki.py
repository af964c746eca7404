"""Certificates and keys for the local control plane, made in-process.

One throw-away CA signs the serving certificates of every component; the
service-account key pair lets TokenRequest issue real, verifiable tokens.
EC P-256 keys: quick to generate, accepted by every component.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = dt.timedelta(days=7)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    ca: CertPair
    serving: CertPair
    service_account: CertPair  # cert = public key PEM, key = private key PEM


def _private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def create_pki(directory: Path) -> Pki:
    """Write a CA, a loopback serving certificate and a service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuheal-sim-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes"),
        x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        # The `kubernetes` Service's address, which pods on a real node dial
        # (gpuheal/sim/realnode.py relays it to the API server).
        x509.IPAddress(ipaddress.ip_address("10.96.0.1")),
    ]
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuheal-sim")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = ec.generate_private_key(ec.SECP256R1())
    sa_pub = sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )

    pem = serialization.Encoding.PEM
    return Pki(
        ca=CertPair(
            _write(directory / "ca.crt", ca_cert.public_bytes(pem)),
            _write(directory / "ca.key", _private_key_pem(ca_key)),
        ),
        serving=CertPair(
            _write(directory / "serving.crt", serving_cert.public_bytes(pem)),
            _write(directory / "serving.key", _private_key_pem(serving_key)),
        ),
        service_account=CertPair(
            _write(directory / "sa.pub", sa_pub),
            _write(directory / "sa.key", _private_key_pem(sa_key)),
        ),
    )


def issue_client_cert(
    pki: Pki, directory: Path, user: str, groups: tuple[str, ...] = ()
) -> CertPair:
    """A client certificate the API server accepts as `user` in `groups`: signed by
    the CA it trusts for clients, CN the user name, O each group (as kubeadm does)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = serialization.load_pem_private_key(pki.ca.key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the CA key is not an EC key")
    ca_cert = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, user)]
        + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    safe = user.replace(":", "_")
    return CertPair(
        _write(directory / f"client-{safe}.crt", cert.public_bytes(serialization.Encoding.PEM)),
        _write(directory / f"client-{safe}.key", _private_key_pem(key)),
    )
