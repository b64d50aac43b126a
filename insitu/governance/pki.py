"""Per-site PKI for mutual TLS on a site's Dask cluster.

Every site has its own certificate authority. The site's scheduler, its workers and its client
processes all present the site's leaf certificate (signed by that CA) and require the peer's
certificate to chain to the same CA, so a process holding another site's certificate, or none, is
refused during the TLS handshake. Dask verifies the chain only (``check_hostname`` is off), so the
trust anchor, not the host name, is what separates sites.

Layout of a site's directory (0700)::

    ca.pem         the site's CA certificate (0644): the trust anchor every process loads
    ca-key.pem     the CA's private key (0600): only needed to issue certificates
    site.pem       the leaf certificate, CN=insitu-<site>, serverAuth+clientAuth (0644)
    site-key.pem   the leaf's private key (0600)

Code that opens ``Client(address)`` without a ``security=`` argument picks up the site's settings when
the process's own environment has ``INSITU_PKI_DIR=<site directory>`` and
``DASK_DISTRIBUTED__CLIENT__SECURITY_LOADER=insitu.governance.pki.security_loader``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from distributed.security import Security

log = logging.getLogger(__name__)

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
LEAF_CERT = "site.pem"
LEAF_KEY = "site-key.pem"
PKI_DIR_ENV = "INSITU_PKI_DIR"
DIR_MODE = 0o700
CERT_MODE = 0o644
KEY_MODE = 0o600


class PkiError(RuntimeError):
    """A site's PKI directory is missing, incomplete or belongs to another site."""


@dataclass(frozen=True)
class SitePki:
    """Paths of one site's TLS material.

    Attributes
    ----------
    ca_file : Path
        PEM certificate of the site's CA: the only trust anchor of the site's processes.
    cert_file : Path
        PEM leaf certificate of the site, signed by ``ca_file``.
    key_file : Path
        PEM private key of ``cert_file`` (unencrypted, mode 0600).
    """

    ca_file: Path
    cert_file: Path
    key_file: Path

    def security(self) -> Security:
        """Dask security settings for any process of this site.

        Returns
        -------
        distributed.security.Security
            ``require_encryption=True``; the client, scheduler and worker roles all present the site
            certificate and verify peers against the site CA only.
        """
        from distributed.security import Security

        cert, key = str(self.cert_file), str(self.key_file)
        return Security(
            require_encryption=True,
            tls_ca_file=str(self.ca_file),
            tls_client_cert=cert,
            tls_client_key=key,
            tls_scheduler_cert=cert,
            tls_scheduler_key=key,
            tls_worker_cert=cert,
            tls_worker_key=key,
        )

    def cli_args(self) -> list[str]:
        """TLS flags for ``dask scheduler`` and ``dask worker``.

        Returns
        -------
        list of str
            ``["--tls-ca-file", CA, "--tls-cert", CERT, "--tls-key", KEY]``. Give the scheduler a
            ``tls://`` address (``--host tls://127.0.0.1``) and the worker the scheduler's ``tls://``
            address; with these flags both require encryption.
        """
        return ["--tls-ca-file", str(self.ca_file), "--tls-cert", str(self.cert_file),
                "--tls-key", str(self.key_file)]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _common_name(site: str) -> str:
    return f"insitu-{site}"


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` atomically with ``mode``, whatever the umask."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _ensure_mode(path: Path, mode: int) -> None:
    current = stat.S_IMODE(path.stat().st_mode)
    if current != mode:
        log.warning("fixing mode of %s: %o -> %o", path, current, mode)
        path.chmod(mode)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _current(cert: x509.Certificate) -> bool:
    return cert.not_valid_before_utc <= _now() < cert.not_valid_after_utc


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    return cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) == key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _load_pair(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """Certificate and key if both exist, parse and match; else ``None``."""
    if not (cert_path.is_file() and key_path.is_file()):
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        log.warning("unreadable %s / %s: %s", cert_path, key_path, e)
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not _same_key(cert, key):
        log.warning("%s does not match %s", key_path, cert_path)
        return None
    return cert, key


def _cn(cert: x509.Certificate) -> str | None:
    attrs = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(attrs[0].value) if attrs else None


def _new_ca(site: str, days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "insitu"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"{_common_name(site)}-ca")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _new_leaf(site: str, days: int, ca_cert: x509.Certificate,
              ca_key: ec.EllipticCurvePrivateKey) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "insitu"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, _common_name(site))]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _leaf_ok(cert: x509.Certificate, site: str, ca_cert: x509.Certificate) -> bool:
    if _cn(cert) != _common_name(site) or not _current(cert):
        return False
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def create_site_pki(directory: Path, site: str, days: int = 365) -> SitePki:
    """Create (or reuse) a site's CA and leaf certificate in ``directory``.

    Parameters
    ----------
    directory : Path
        The site's own PKI directory (created with mode 0700; its mode is tightened to 0700).
    site : str
        Site name; the leaf's subject is ``CN=insitu-<site>``.
    days : int, default 365
        Validity of newly issued certificates (a leaf never outlives its CA).

    Returns
    -------
    SitePki
        Paths of the CA certificate, leaf certificate and leaf key.

    Raises
    ------
    PkiError
        If ``directory`` holds a valid CA of another site.
    ValueError
        If ``site`` is empty or ``days`` is not positive.

    Notes
    -----
    Idempotent: a current CA of this site is reused, and so is a leaf that it signed, that matches
    its key, names this site and is current; otherwise the leaf is reissued by the existing CA. Only
    a missing, unreadable or expired CA is replaced (which invalidates every certificate it signed).
    Key files are 0600, certificates 0644; existing files with other modes are fixed.
    """
    if not site or "/" in site:
        raise ValueError(f"invalid site name {site!r}")
    if days < 1:
        raise ValueError(f"days must be positive, got {days}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    _ensure_mode(directory, DIR_MODE)

    ca = _load_pair(directory / CA_CERT, directory / CA_KEY)
    if ca is not None and _cn(ca[0]) != f"{_common_name(site)}-ca":
        raise PkiError(f"{directory} holds the CA of {_cn(ca[0])!r}, not of site {site!r}")
    if ca is None or not _current(ca[0]):
        log.info("issuing a new CA for site %s in %s", site, directory)
        ca = _new_ca(site, days)
        _write(directory / CA_KEY, _key_pem(ca[1]), KEY_MODE)
        _write(directory / CA_CERT, ca[0].public_bytes(serialization.Encoding.PEM), CERT_MODE)
        leaf = None
    else:
        leaf = _load_pair(directory / LEAF_CERT, directory / LEAF_KEY)
    ca_cert, ca_key = ca
    if leaf is None or not _leaf_ok(leaf[0], site, ca_cert):
        log.info("issuing a new certificate for site %s in %s", site, directory)
        cert, key = _new_leaf(site, days, ca_cert, ca_key)
        _write(directory / LEAF_KEY, _key_pem(key), KEY_MODE)
        _write(directory / LEAF_CERT, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE)
    else:
        log.debug("reusing the PKI of site %s in %s", site, directory)
    for name, mode in ((CA_CERT, CERT_MODE), (CA_KEY, KEY_MODE), (LEAF_CERT, CERT_MODE), (LEAF_KEY, KEY_MODE)):
        _ensure_mode(directory / name, mode)
    return load_site_pki(directory)


def load_site_pki(directory: Path) -> SitePki:
    """Paths of an existing site PKI (the CA key is not needed and not checked).

    Parameters
    ----------
    directory : Path
        A directory written by :func:`create_site_pki`.

    Returns
    -------
    SitePki
        Absolute paths of the CA certificate, leaf certificate and leaf key.

    Raises
    ------
    PkiError
        If one of the three files is missing.
    """
    directory = Path(directory).absolute()
    pki = SitePki(directory / CA_CERT, directory / LEAF_CERT, directory / LEAF_KEY)
    missing = [str(p) for p in (pki.ca_file, pki.cert_file, pki.key_file) if not p.is_file()]
    if missing:
        raise PkiError(f"incomplete site PKI in {directory}: missing {', '.join(missing)}")
    return pki


def security_loader(info: dict[str, Any]) -> Security | None:
    """Dask ``distributed.client.security-loader`` hook: this process's site credentials.

    Parameters
    ----------
    info : dict
        Passed by Dask (``{"address": ...}``); unused: the credentials come from the process's own
        environment, never from the address it is asked to reach.

    Returns
    -------
    distributed.security.Security or None
        The site's settings when ``INSITU_PKI_DIR`` is set (a ``tcp://`` address is then refused,
        since encryption is required), else ``None`` (Dask's configuration applies).
    """
    directory = os.environ.get(PKI_DIR_ENV)
    if not directory:
        return None
    return load_site_pki(Path(directory)).security()
