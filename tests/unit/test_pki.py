"""Per-site PKI: file modes, idempotence, chains, and Dask's own TLS contexts (no processes, no sockets)."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from insitu.governance import pki as pki_mod
from insitu.governance.pki import PkiError, SitePki, create_site_pki, load_site_pki, security_loader


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _cert(p: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(p.read_bytes())


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, SitePki]:
    root = tmp_path_factory.mktemp("pki")
    return {s: create_site_pki(root / s, s) for s in ("eu", "us")}


def test_modes_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        p = create_site_pki(tmp_path / "pki" / "eu", "eu")
    finally:
        os.umask(old)
    d = tmp_path / "pki" / "eu"
    assert _mode(d) == 0o700
    assert _mode(p.key_file) == _mode(d / "ca-key.pem") == 0o600
    assert _mode(p.cert_file) == _mode(p.ca_file) == 0o644
    assert sorted(x.name for x in d.iterdir()) == ["ca-key.pem", "ca.pem", "site-key.pem", "site.pem"]


def test_idempotent_and_fixes_modes(tmp_path):
    d = tmp_path / "eu"
    first = create_site_pki(d, "eu")
    before = {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in d.iterdir()}
    first.key_file.chmod(0o644)
    second = create_site_pki(d, "eu")
    assert second == first == load_site_pki(d)
    assert {f.name: f.read_bytes() for f in d.iterdir()} == {k: v[0] for k, v in before.items()}
    assert _mode(second.key_file) == 0o600


def test_chain_and_extensions(sites):
    eu, us = sites["eu"], sites["us"]
    ca, leaf = _cert(eu.ca_file), _cert(eu.cert_file)
    leaf.verify_directly_issued_by(ca)
    with pytest.raises(InvalidSignature):
        leaf.verify_directly_issued_by(_same_name_other_ca(ca, us))
    with pytest.raises(ValueError):  # issuer name differs: insitu-us-ca did not sign insitu-eu
        leaf.verify_directly_issued_by(_cert(us.ca_file))
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "insitu-eu"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert leaf.not_valid_after_utc <= ca.not_valid_after_utc
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc > dt.timedelta(days=364)


def _same_name_other_ca(eu_ca: x509.Certificate, us: SitePki) -> x509.Certificate:
    """A certificate named like eu's CA but carrying us's CA key (a forged issuer)."""
    key = serialization.load_pem_private_key((us.ca_file.parent / "ca-key.pem").read_bytes(), None)
    return (x509.CertificateBuilder().subject_name(eu_ca.subject).issuer_name(eu_ca.subject)
            .public_key(key.public_key()).serial_number(1).not_valid_before(eu_ca.not_valid_before_utc)
            .not_valid_after(eu_ca.not_valid_after_utc).sign(key, hashes.SHA256()))


def _client_ctx(sec) -> ssl.SSLContext:
    return sec.get_connection_args("client")["ssl_context"]


def test_dask_tls_contexts_accept_only_the_site(sites):
    """Dask's own contexts: a site's leaf is accepted only under that site's CA, in both directions."""
    from distributed.security import Security

    eu, us = sites["eu"], sites["us"]
    assert _handshake(eu.security(), _client_ctx(eu.security()))
    assert not _handshake(eu.security(), _client_ctx(us.security()))  # us rejects eu's server cert
    assert not _handshake(us.security(), _client_ctx(eu.security()))
    # a client that trusts eu's (public) CA but presents us's cert, or no cert: the server refuses
    rogue = Security(require_encryption=True, tls_ca_file=str(eu.ca_file), tls_client_cert=str(us.cert_file),
                     tls_client_key=str(us.key_file))
    assert not _handshake(eu.security(), _client_ctx(rogue))
    anonymous = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(eu.ca_file))
    anonymous.check_hostname = False
    assert not _handshake(eu.security(), anonymous)


def _handshake(server_sec, cctx: ssl.SSLContext) -> bool:
    """Run a TLS handshake between Dask's listen context and ``cctx`` over memory BIOs."""
    sctx = server_sec.get_listen_args("scheduler")["ssl_context"]
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    srv = sctx.wrap_bio(s_in, s_out, server_side=True)
    cli = cctx.wrap_bio(c_in, c_out, server_side=False)
    done = {"srv": False, "cli": False}
    for _ in range(20):
        for name, end in (("cli", cli), ("srv", srv)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLError:
                    return False
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after the client finished; make
            # the server process it and the client read the verdict.
            try:
                cli.write(b"x")
                s_in.write(c_out.read())
                srv.read(1)
            except ssl.SSLError:
                return False
            return True
    return False


def test_security_and_cli_args(sites):
    eu = sites["eu"]
    sec = eu.security()
    assert sec.require_encryption is True
    assert sec.tls_ca_file == str(eu.ca_file)
    for role in ("client", "scheduler", "worker"):
        cfg = sec.get_tls_config_for_role(role)
        assert (cfg["cert"], cfg["key"]) == (str(eu.cert_file), str(eu.key_file))
        assert isinstance(sec.get_connection_args(role)["ssl_context"], ssl.SSLContext)
    assert eu.cli_args() == ["--tls-ca-file", str(eu.ca_file), "--tls-cert", str(eu.cert_file),
                             "--tls-key", str(eu.key_file)]


def test_directory_of_another_site_is_refused(sites):
    with pytest.raises(PkiError, match="insitu-eu-ca"):
        create_site_pki(sites["eu"].ca_file.parent, "us")


def test_leaf_reissued_under_same_ca(tmp_path):
    d = tmp_path / "eu"
    p = create_site_pki(d, "eu")
    ca_before = p.ca_file.read_bytes()
    p.key_file.write_bytes(b"garbage")  # unreadable key: the leaf is reissued, the CA kept
    q = create_site_pki(d, "eu")
    assert q.ca_file.read_bytes() == ca_before
    _cert(q.cert_file).verify_directly_issued_by(_cert(q.ca_file))
    assert _mode(q.key_file) == 0o600


def test_expired_ca_is_replaced(tmp_path, monkeypatch):
    d = tmp_path / "eu"
    p = create_site_pki(d, "eu", days=1)
    old_ca = p.ca_file.read_bytes()
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    monkeypatch.setattr(pki_mod, "_now", lambda: later)
    q = create_site_pki(d, "eu", days=30)
    assert q.ca_file.read_bytes() != old_ca
    leaf = _cert(q.cert_file)
    leaf.verify_directly_issued_by(_cert(q.ca_file))
    assert leaf.not_valid_before_utc <= later < leaf.not_valid_after_utc


def test_load_incomplete_and_bad_args(tmp_path):
    with pytest.raises(PkiError, match="missing"):
        load_site_pki(tmp_path)
    with pytest.raises(ValueError):
        create_site_pki(tmp_path / "x", "")
    with pytest.raises(ValueError):
        create_site_pki(tmp_path / "x", "eu", days=0)


def test_security_loader_reads_own_environment(sites, monkeypatch):
    monkeypatch.delenv(pki_mod.PKI_DIR_ENV, raising=False)
    assert security_loader({"address": "tls://127.0.0.1:1"}) is None
    monkeypatch.setenv(pki_mod.PKI_DIR_ENV, str(sites["us"].ca_file.parent))
    sec = security_loader({"address": "tls://127.0.0.1:1"})
    assert sec is not None and sec.tls_client_cert == str(sites["us"].cert_file)
