"""TLS between lab hosts: Ray's own (`RAY_USE_TLS`), so the cluster's token and everything the lab sends — models,
rows, logs — cross the lab network encrypted, and a node proves it holds a certificate of the lab's CA.

A lab's TLS folder holds the lab's CA (`ca.crt`; its key `ca.key` stays on the head) and one certificate per lab
host (`HOST.crt`, `HOST.key`) naming the addresses it is reached at. `devicelab head --make-certs --tls DIR` makes
the CA and the head's certificate; `devicelab cert --tls DIR --host NAME --ip ADDR` makes another host's, to copy
to it with `ca.crt`. Every process of a lab host — `head`, `worker`, the driver of `run --cluster` — is given the
folder (`--tls DIR` or DEVICELAB_TLS) and uses its host's certificate as server and client (mutual TLS)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from ..errors import DevicelabError

TLS_ENV = "DEVICELAB_TLS"  # the lab's TLS folder, for every devicelab process of this lab host
DAYS = 825  # the longest validity clients still accept for a leaf certificate


def _write_private(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name(cn: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "devicelab"), x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    )


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(folder: Path) -> bool:
    """The lab's CA in `folder` (0700), unless it has one; True when it was made now."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if (folder / "ca.crt").exists():
        return False
    key, now = _key(), datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("devicelab lab CA"))
        .issuer_name(_name("devicelab lab CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=10 * 365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write_private(folder / "ca.key", _pem_key(key))
    (folder / "ca.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return True


def issue(folder: Path, host: str, ips: list[str], dns: list[str] | None = None) -> tuple[Path, Path]:
    """A certificate for lab host `host`, signed by the lab's CA, naming its addresses (and loopback, where its
    own processes reach it); returns (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if not (folder / "ca.key").exists():
        raise DevicelabError(
            f"{folder} holds no CA key: make the certificates on the head (devicelab head --make-certs --tls {folder})"
        )
    ca_key = serialization.load_pem_private_key((folder / "ca.key").read_bytes(), None)
    signers = (
        ec.EllipticCurvePrivateKey,
        rsa.RSAPrivateKey,
        ed25519.Ed25519PrivateKey,
        ed448.Ed448PrivateKey,
        dsa.DSAPrivateKey,
    )
    if not isinstance(ca_key, signers):  # the lab's CA key is an EC key (make_ca); one made by hand may be another
        raise DevicelabError(f"{folder / 'ca.key'} is no key a certificate can be signed with")
    ca = x509.load_pem_x509_certificate((folder / "ca.crt").read_bytes())
    addrs: list[x509.GeneralName] = []
    for ip in [*ips, "127.0.0.1"]:
        try:
            addrs.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise DevicelabError(f"{ip!r} is not an IP address: give the address the lab reaches {host} at") from None
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in dict.fromkeys([host, "localhost", *(dns or [])])]
    key, now = _key(), datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(host))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(x509.SubjectAlternativeName(list(dict.fromkeys(addrs)) + names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    crt, key_path = folder / f"{host}.crt", folder / f"{host}.key"
    _write_private(key_path, _pem_key(key))
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return crt, key_path


def env_for(folder: Path, host: str) -> dict[str, str]:
    """Ray's TLS settings for lab host `host` from the lab's TLS folder; one line naming the fix when it lacks
    what this host needs, or a key other users can read."""
    folder = Path(folder).expanduser().resolve()
    crt, key, ca = folder / f"{host}.crt", folder / f"{host}.key", folder / "ca.crt"
    for p in (ca, crt, key):
        if not p.exists():
            raise DevicelabError(
                f"{p} is missing: on the head, `devicelab cert --tls DIR --host {host} --ip ADDRESS` makes this "
                f"host's certificate; copy ca.crt, {host}.crt and {host}.key into {folder}"
            )
    if key.stat().st_mode & 0o077:
        raise DevicelabError(f"{key} is readable by other users: chmod 600 {key}")
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": str(crt),
        "RAY_TLS_SERVER_KEY": str(key),
        "RAY_TLS_CA_CERT": str(ca),
    }


def use(folder: Path | str | None, host: str, client: bool = False) -> bool:
    """Turn Ray's TLS on for this process and the Ray processes it starts (the folder given, else DEVICELAB_TLS);
    False when none is given. A `client` (a run's driver, a read of the cluster's state) on the head, where the CA
    key is, gets a certificate of its own made when it has none."""
    folder = folder or os.environ.get(TLS_ENV)
    if not folder:
        return False
    folder = Path(folder).expanduser()
    if client and not (folder / f"{host}.crt").exists() and (folder / "ca.key").exists():
        issue(folder, host, [])
    os.environ.update(env_for(folder, host))
    os.environ[TLS_ENV] = str(Path(folder).expanduser().resolve())
    return True
