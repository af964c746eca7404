from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuheal.sim.pki import create_pki


def test_serving_cert_is_signed_by_the_ca_and_names_loopback(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    ca = x509.load_pem_x509_certificate(pki.ca.cert.read_bytes())
    serving = x509.load_pem_x509_certificate(pki.serving.cert.read_bytes())

    serving.verify_directly_issued_by(ca)
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "kubernetes.default.svc" in san.get_values_for_type(x509.DNSName)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_keys_are_private_files(tmp_path: Path) -> None:
    pki = create_pki(tmp_path)
    for path in (pki.ca.key, pki.serving.key, pki.service_account.key):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    public = serialization.load_pem_public_key(pki.service_account.cert.read_bytes())
    assert isinstance(public, ec.EllipticCurvePublicKey)  # ES256: every component accepts it
