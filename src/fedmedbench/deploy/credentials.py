"""Local TLS certificates and SuperNode keys for a deployment on machines you control.

A real federation gets its server certificate from the hospital's PKI; this module makes a
self-signed CA, a SuperLink certificate for the given host names/addresses, and one EC P-384
key pair per site (Flower's SuperNode authentication takes NIST-curve keys in OpenSSH
format). Private keys are written 0600. Nothing here talks to the network.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 365


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _alt_names(hosts: list[str]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(entries)


def make_tls(folder: str | Path, hosts: list[str]) -> TlsFiles:
    """A CA and a SuperLink certificate valid for ``hosts`` (names or IP addresses)."""
    folder = Path(folder)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("fedmedbench local CA")).issuer_name(_name("fedmedbench local CA"))
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .sign(ca_key, hashes.SHA384()))
    key = ec.generate_private_key(ec.SECP384R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(_alt_names(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA384()))
    files = TlsFiles(folder / "ca.crt", folder / "server.pem", folder / "server.key")
    _write(files.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.server_cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.server_key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()), private=True)
    return files


def make_node_key(folder: str | Path, name: str) -> tuple[Path, Path]:
    """One site's SuperNode key pair (OpenSSH format): (private, public)."""
    folder = Path(folder)
    key = ec.generate_private_key(ec.SECP384R1())
    private = folder / name
    public = folder / f"{name}.pub"
    _write(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                      serialization.NoEncryption()), private=True)
    _write(public, key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH),
           private=False)
    return private, public
