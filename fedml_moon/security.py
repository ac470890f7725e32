"""Credentials for runs across sites: a private CA, the server's certificate, one certificate and one
token per silo (`fedml-moon certs DIR --silos N --host ...`), and the checks the server makes.

A silo's identity is its rank: in its certificate's common name (`silo-<rank>`) or in the token table
the server holds (`server-tokens.json`: rank -> SHA-256 of the silo's token; the token itself stays
with the silo). The operator's token (`operator.token`, its digest under `operator` in the same table)
reads the server's status port. Keys and tokens are written readable by their owner only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SILO_CN = "silo-"
OPERATOR = "operator"  # server-tokens.json's entry, and the status port's user, of the operator's token
SERVER_CN = "fedml-moon server"
CAP_OID = "1.3.6.1.4.1.59881.1.1"  # a silo certificate's cap on the samples its party may claim


def _write(path: Path, data: bytes, private: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert(
    subject_cn: str, key, issuer_cn: str, issuer_key, days: int, *, ca: bool, sans=None, usage=None, cap=None
):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # what strict verifiers require (RFC 5280; Python 3.13's default TLS context): key ids, usage
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
        )
        .add_extension(_key_usage(ca), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if cap is not None:
        value = x509.UnrecognizedExtension(x509.ObjectIdentifier(CAP_OID), str(int(cap)).encode())
        builder = builder.add_extension(value, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _key_usage(ca: bool):
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _sans(hosts: list[str]) -> list:
    from cryptography import x509

    out = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


GITIGNORE = "# Written by fedml-moon certs: private keys and tokens never belong in a repository.\n*\n"


def make_certs(
    folder: Path,
    silos: int,
    hosts: list[str],
    days: int = 825,
    caps: dict[int, int] | None = None,
    force: bool = False,
) -> list[Path]:
    """Write ca.pem / ca.key, server.pem / server.key (valid for `hosts`), silo-<r>.pem / .key /
    .token for r = 1..silos, operator.token (reads the status port), server-tokens.json (the tokens'
    digests), mosquitto.acl, and a .gitignore that keeps git from
    adding any of them. `caps`: rank -> the most samples its party may
    claim, signed into its certificate and kept beside its token's digest. Returns the files written.
    A folder that holds credentials already (a CA, keys, tokens) is refused, naming them, unless
    `force`: a new CA would leave every certificate and token issued from the old one worthless."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if silos < 1:
        raise ValueError("--silos must be >= 1")
    caps = dict(caps or {})
    if any(not 1 <= r <= silos or n < 1 for r, n in caps.items()):
        raise ValueError(f"--max-samples: RANK=N with RANK in 1..{silos} and N >= 1; got {caps}")
    folder = Path(folder)
    _refuse_earlier(folder, force)
    folder.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key = _key()
    ca = _cert("fedml-moon CA", ca_key, "fedml-moon CA", ca_key, days, ca=True)
    files = {"ca.pem": ca.public_bytes(pem), "ca.key": _pem_key(ca_key)}
    server_key = _key()
    server = _cert(
        SERVER_CN,
        server_key,
        "fedml-moon CA",
        ca_key,
        days,
        ca=False,
        sans=_sans(hosts),
        usage=[ExtendedKeyUsageOID.SERVER_AUTH],
    )
    files.update({"server.pem": server.public_bytes(pem), "server.key": _pem_key(server_key)})
    table = {}
    for rank in range(1, silos + 1):
        key = _key()
        cert = _cert(
            f"{SILO_CN}{rank}",
            key,
            "fedml-moon CA",
            ca_key,
            days,
            ca=False,
            usage=[ExtendedKeyUsageOID.CLIENT_AUTH],
            cap=caps.get(rank),
        )
        token = secrets.token_urlsafe(32)
        digest = token_digest(token)
        table[str(rank)] = {"sha256": digest, "max_samples": caps[rank]} if rank in caps else digest
        files.update({f"silo-{rank}.pem": cert.public_bytes(pem), f"silo-{rank}.key": _pem_key(key)})
        files[f"silo-{rank}.token"] = token.encode()
    operator = secrets.token_urlsafe(32)  # reads the server's status port (tracking_args.status_port)
    table[OPERATOR] = token_digest(operator)
    files[f"{OPERATOR}.token"] = operator.encode()
    files["server-tokens.json"] = json.dumps(table, indent=2).encode()
    files["mosquitto.acl"] = mosquitto_acl(silos).encode()
    files[".gitignore"] = GITIGNORE.encode()
    written = []
    for name, data in files.items():
        _write(folder / name, data, private=name.endswith((".key", ".token")))
        written.append(folder / name)
    return written


def _refuse_earlier(folder: Path, force: bool) -> None:
    """Refuse a folder that holds credentials an earlier `fedml-moon certs` wrote, unless `force`."""
    if force or not folder.is_dir():
        return
    earlier = sorted(
        p.name
        for p in folder.iterdir()
        if p.name in ("ca.pem", "ca.key", "server-tokens.json", "mosquitto.acl")
        or p.suffix in (".pem", ".key", ".token")
    )
    if earlier:
        raise FileExistsError(
            f"{folder} holds credentials already ({', '.join(earlier[:8])}"
            f"{f' and {len(earlier) - 8} more' if len(earlier) > 8 else ''}): a new CA would leave every "
            "certificate and token issued from them worthless; give another folder, or --force to replace "
            "them"
        )


def mosquitto_acl(silos: int) -> str:
    """A mosquitto ACL for the MQTT_S3 mode: user `server` and each user `silo-<r>` may publish only
    as themselves and read only what is addressed to them (any run id)."""
    lines = ["user server", "topic write fedml_moon/+/to/+/from/0", "topic read fedml_moon/+/to/0/from/+", ""]
    for rank in range(1, silos + 1):
        lines += [
            f"user silo-{rank}",
            f"topic write fedml_moon/+/to/0/from/{rank}",
            f"topic read fedml_moon/+/to/{rank}/from/0",
            "",
        ]
    return "\n".join(lines)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def load_token_table(path: str | Path) -> dict[int, str]:
    """rank -> SHA-256 hex digest, from server-tokens.json (a rank's entry: its digest, or
    {"sha256": digest, "max_samples": cap})."""
    raw = json.loads(Path(path).read_text())
    return {int(r): str(v["sha256"] if isinstance(v, dict) else v) for r, v in raw.items() if r.isdigit()}


def load_token_caps(path: str | Path) -> dict[int, int]:
    """rank -> the cap on its party's claimed samples, for the ranks server-tokens.json gives one."""
    raw = json.loads(Path(path).read_text())
    return {
        int(r): int(v["max_samples"])
        for r, v in raw.items()
        if r.isdigit() and isinstance(v, dict) and "max_samples" in v
    }


def cert_cap(pem: bytes) -> int | None:
    """The cap a silo certificate carries (`make_certs(..., caps)`), or None."""
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    try:
        ext = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(CAP_OID))
    except x509.ExtensionNotFound:
        return None
    return int(ext.value.value.decode())


def check_token(table: Mapping[Any, str], rank: Any, token: str) -> bool:
    """Whether `token` is `rank`'s in `table` (a silo's rank; the status port's user names), by a
    constant-time comparison of the digests."""
    expected = table.get(rank)
    return expected is not None and hmac.compare_digest(expected, token_digest(token))


def rank_of_common_name(name: str) -> int | None:
    """`silo-<rank>` -> rank; anything else -> None."""
    if name.startswith(SILO_CN) and name[len(SILO_CN) :].isdigit():
        return int(name[len(SILO_CN) :])
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
