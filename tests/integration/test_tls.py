"""TLS between workers and the API (trace_platform/tls.py, docs/tls.md), with certificates made
here: a worker's client reaches the API and its exchange listener over https on 127.0.0.1 when
it trusts their CA, and refuses a certificate it does not trust; a worker refuses a plain-http
API on another host unless told the network is private."""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support.cli import trace
from trace_platform.config import Settings
from trace_platform.contract import TaskSpec
from trace_platform.contract_fleet import WorkerRegistration
from trace_platform.db.embedded import free_port
from trace_platform.lite.stack import ApiServer, LiteStack
from trace_platform.services import Services
from trace_platform.tls import check_worker_url, client_context, worker_tls
from trace_platform.worker.client import DispatcherClient
from trace_platform.worker.http import TransportError
from trace_platform.worker.membership import new_worker_id

COMPOSE = Path(__file__).parents[2] / "deploy" / "docker-compose.yml"


@dataclass
class Certs:
    ca: Path  # the CA that signed the server's certificate
    rogue_ca: Path  # another CA, which signed nothing the server has
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    """A certificate of `key` for `subject`, valid for a day (from five minutes ago)."""
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(cn), _name(cn), key)
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    ca_key, ca = _ca("trace test CA")
    _, rogue = _ca("someone else's CA")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name("trace api"), ca.subject, key)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    out = Certs(
        ca=tmp_path / "ca.pem",
        rogue_ca=tmp_path / "rogue.pem",
        cert=tmp_path / "api.pem",
        key=tmp_path / "api.key",
    )
    out.ca.write_bytes(_pem(ca))
    out.rogue_ca.write_bytes(_pem(rogue))
    out.cert.write_bytes(_pem(cert))
    out.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    out.key.chmod(0o600)
    return out


@dataclass
class Https:
    services: Services
    server: ApiServer
    exchange_url: str


@pytest.fixture
def https_api(settings: Settings, dsn: str, certs: Certs) -> Iterator[Https]:
    tls = settings.model_copy(
        update={"api_tls_cert": certs.cert, "api_tls_key": certs.key, "exchange_port": free_port()}
    )
    services = Services.build(tls, dsn)
    server = ApiServer(services, "127.0.0.1", free_port(), background=False)
    server.start()
    yield Https(services, server, f"https://127.0.0.1:{tls.exchange_port}")
    server.stop()
    services.close()


def _client(api: Https, ca: Path | None, listener: bool = True) -> DispatcherClient:
    return DispatcherClient(
        api.server.url,
        internal_token=api.services.internal_token,
        retries=0,
        exchange_url=api.exchange_url if listener else None,
        tls=client_context(ca),
    )


def _registration() -> WorkerRegistration:
    return WorkerRegistration(
        worker_id=new_worker_id("far.example"),
        host="far.example",
        pid=7,
        version="0.1.0",
        slots=1,
        beat_seconds=5,
    )


def test_a_worker_client_talks_to_the_api_and_its_listener_over_https(
    https_api: Https, certs: Certs
) -> None:
    assert https_api.server.url.startswith("https://127.0.0.1:")
    client = _client(https_api, certs.ca)
    try:
        # An /internal route of the API (uvicorn's TLS)...
        assert client.register_worker(_registration(), timeout=10).state == "alive"
        # ...and a claim and its completion, which the exchange listener carries (its TLS).
        d = https_api.services.dispatcher
        ref = d.create_task(TaskSpec(job="tls", operator="noop"))
        claim = client.claim(ref.task_id, "far.example:7:abcd")
        assert client.complete(claim, "succeeded").status == "succeeded"
        listener = https_api.server.app.state.exchange_listener
        assert listener.server.answered >= 2
        assert client.listener is not None  # never given up on
    finally:
        client.close()


def test_a_worker_client_refuses_a_certificate_it_does_not_trust(
    https_api: Https, certs: Certs
) -> None:
    for ca in (certs.rogue_ca, None):  # another CA's, and certifi's (public CAs)
        client = _client(https_api, ca, listener=False)
        try:
            with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
                client.register_worker(_registration(), timeout=10)
        finally:
            client.close()
    # The listener too: the worker falls back to the API's route, which refuses alike.
    client = _client(https_api, certs.rogue_ca)
    try:
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED"):
            client.listener.request("POST", "/internal/exchange", content=b"{}")  # type: ignore[union-attr]
    finally:
        client.close()
    with https_api.services.pool.connection() as conn:
        assert conn.execute("SELECT count(*) AS n FROM workers").fetchone()["n"] == 0


def test_the_server_certificate_must_name_the_host(https_api: Https, certs: Certs) -> None:
    """Trusted CA, but the URL's host is not in the certificate: refused."""
    port = https_api.server.url.rsplit(":", 1)[1]
    client = DispatcherClient(
        f"https://127.0.0.2:{port}", internal_token="x", retries=0, tls=client_context(certs.ca)
    )
    try:
        with pytest.raises(TransportError):
            client.register_worker(_registration(), timeout=10)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("url", "insecure", "refused"),
    [
        ("http://127.0.0.1:8765", False, False),
        ("http://localhost:8765", False, False),
        ("http://[::1]:8765", False, False),
        ("https://api.example.com", False, False),
        ("http://api.example.com:8765", False, True),
        ("http://10.0.0.5:8765", False, True),
        ("http://api:8765", False, True),
        ("http://api:8765", True, False),
    ],
)
def test_plain_http_to_another_host_is_refused_unless_opted_out(
    url: str, insecure: bool, refused: bool
) -> None:
    s = Settings(api_insecure_http=insecure)
    if refused:
        with pytest.raises(ValueError, match="in clear"):
            check_worker_url(url, s, "the API URL")
    else:
        check_worker_url(url, s, "the API URL")


@pytest.mark.parametrize(("bind", "reached"), [("0.0.0.0", "127.0.0.1"), ("::", "[::1]")])
def test_an_api_bound_to_every_interface_is_reached_on_loopback(
    bind: str, reached: str, settings: Settings
) -> None:
    """TRACE_API_HOST=0.0.0.0 (the API reachable from other machines) is where the API
    listens, not a host to connect to: a worker on this host, and a Lite stack's workers,
    reach it on loopback, where plain http is allowed. It was their URL as is, refused as
    "another host", so every worker of `TRACE_API_HOST=0.0.0.0 trace up` exited at start."""
    s = Settings(api_host=bind, api_port=8765)
    assert s.resolved_api_url == f"http://{reached}:8765"
    worker_tls(s, s.resolved_api_url)
    stack = LiteStack(settings.model_copy(update={"api_host": bind}), workers=0)
    try:
        assert stack.url.startswith(f"http://{reached}:")
        assert stack.exchange_url.startswith(f"http://{reached}:")
        worker_tls(stack.settings, stack.url, stack.exchange_url)
    finally:
        stack.services.close()


def test_the_compose_workers_opt_out_on_their_private_network() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    env = compose["x-trace-env"]
    s = Settings(api_insecure_http=env["TRACE_API_INSECURE_HTTP"] == "true")
    for key in ("TRACE_API_URL", "TRACE_EXCHANGE_URL"):
        check_worker_url(env[key], s, key)
    with pytest.raises(ValueError):  # and without it they would refuse to start
        check_worker_url(env["TRACE_API_URL"], Settings(), "TRACE_API_URL")


def _said(p: subprocess.CompletedProcess[str]) -> str:
    """What the command printed, as one line (rich wraps long paths)."""
    return " ".join((p.stdout + p.stderr).split())


def test_a_worker_and_the_api_refuse_bad_tls_settings_at_start(tmp_path: Path) -> None:
    env = {"TRACE_HOME": str(tmp_path), "TRACE_INTERNAL_TOKEN": "t"}
    worker = trace(["worker"], env | {"TRACE_API_URL": "http://10.9.8.7:8765"})
    assert worker.returncode == 1 and "in clear" in _said(worker), _said(worker)
    missing = tmp_path / "none.pem"
    api = trace(
        ["api"], env | {"TRACE_API_TLS_CERT": str(missing), "TRACE_API_TLS_KEY": str(missing)}
    )
    assert api.returncode == 1 and "cannot load them" in _said(api), _said(api)
    bundle = trace(
        ["worker"],
        env | {"TRACE_API_URL": "https://10.9.8.7:8765", "TRACE_API_CA_BUNDLE": str(missing)},
    )
    assert bundle.returncode == 1 and "TRACE_API_CA_BUNDLE" in _said(bundle), _said(bundle)
    with pytest.raises(ValueError, match="go together"):
        Settings(api_tls_cert=missing)


def test_health_checks_speak_https(https_api: Https, certs: Certs, settings: Settings) -> None:
    """The API's check reaches its own https listener (whatever host its certificate names);
    a worker's verifies the API as the worker does."""
    from trace_platform.health import checks

    port = int(https_api.server.url.rsplit(":", 1)[1])
    s = settings.model_copy(
        update={
            "api_host": "127.0.0.1",
            "api_port": port,
            "api_tls_cert": certs.cert,
            "api_tls_key": certs.key,
        }
    )
    checks("api", s)["api"]()
    checks("worker", s.model_copy(update={"api_ca_bundle": certs.ca}))["api"]()
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        checks("worker", s.model_copy(update={"api_ca_bundle": certs.rogue_ca}))["api"]()
