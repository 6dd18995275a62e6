"""`qm webhook certs`: the CA, the serving certificate, and the configurations it fills in."""

import base64
import datetime as dt
import ipaddress
import ssl

import aiohttp
import pytest
import typer
import yaml
from cryptography import x509
from typer.testing import CliRunner

from services.admission.webhook import make_app, serve
from services.admission.webhook_certs import issue, service_names, with_ca_bundle
from services.cli import webhook_cmd
from services.cli.webhook_cmd import MANIFEST
from services.demo.stack import free_base_port
from services.policy.live import StaticLiveState


def test_the_serving_certificate_names_every_host_and_is_signed_by_the_ca():
    now = dt.datetime(2026, 12, 6, tzinfo=dt.UTC)
    tls = issue([*service_names("qm-admission", "qm-system"), "127.0.0.1", "qm-admission"], days=30, now=now)
    ca, cert = x509.load_pem_x509_certificate(tls.ca_cert), x509.load_pem_x509_certificate(tls.cert)
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "qm-admission", "qm-admission.qm-system", "qm-admission.qm-system.svc", "qm-admission.qm-system.svc.cluster.local"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert cert.not_valid_before_utc == now - dt.timedelta(minutes=5)
    assert cert.not_valid_after_utc == now + dt.timedelta(days=30)
    assert base64.b64decode(tls.ca_bundle) == tls.ca_cert
    assert tls.key.startswith(b"-----BEGIN PRIVATE KEY-----")


@pytest.mark.parametrize("hosts, days, error", [([], 1, "at least one host"), (["x"], 0, "at least 1")])
def test_bad_requests_say_what_is_wrong(hosts, days, error):
    with pytest.raises(ValueError, match=error):
        issue(hosts, days=days)


def manifest():
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_the_in_cluster_configurations_get_the_ca_and_keep_their_service():
    docs = with_ca_bundle(manifest(), "Q0E=")
    assert [d["kind"] for d in docs] == [d["kind"] for d in manifest()]  # the Service kept
    hooks = [w for d in docs if "webhooks" in d for w in d["webhooks"]]
    assert len(hooks) == 2
    for hook in hooks:
        assert hook["clientConfig"]["caBundle"] == "Q0E=" and hook["clientConfig"]["service"]["port"] == 443
    assert all("annotations" not in d["metadata"] for d in docs if "webhooks" in d)  # no cert-manager injection
    assert all("caBundle" not in w["clientConfig"] for d in manifest() if "webhooks" in d for w in d["webhooks"])


def test_with_a_url_the_webhooks_call_it_and_the_service_is_left_out():
    docs = with_ca_bundle(manifest(), "Q0E=", url="https://127.0.0.1:8443/")
    assert sorted(d["kind"] for d in docs) == ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
    urls = sorted(w["clientConfig"]["url"] for d in docs for w in d["webhooks"])
    assert urls == ["https://127.0.0.1:8443/mutate", "https://127.0.0.1:8443/validate"]
    assert all("service" not in w["clientConfig"] for d in docs for w in d["webhooks"])


async def test_the_webhook_serves_the_certificate_and_a_client_trusting_the_ca_accepts_it(tmp_path):
    tls = issue(["localhost", "127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(tls.cert)
    (tmp_path / "tls.key").write_bytes(tls.key)
    port = free_base_port(1)
    runner = await serve(make_app(lambda: None, StaticLiveState()), "127.0.0.1", port,
                         tmp_path / "tls.crt", tmp_path / "tls.key")
    try:
        ctx = ssl.create_default_context(cadata=tls.ca_cert.decode())
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
            for host in ("localhost", "127.0.0.1"):
                async with session.get(f"https://{host}:{port}/healthz") as r:
                    assert r.status == 200
    finally:
        await runner.cleanup()


def test_the_command_writes_the_files_and_says_what_to_do_next(tmp_path):
    app = typer.Typer()
    webhook_cmd.register(app)
    out = tmp_path / "certs"
    result = CliRunner().invoke(app, ["webhook", "certs", str(out), "--url", "https://127.0.0.1:9443"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["admission-webhook.yaml", "ca.crt", "tls.crt", "tls.key"]
    assert (out / "tls.key").stat().st_mode & 0o777 == 0o600
    assert "QM_WEBHOOK_PORT=9443" in result.output and "kubectl apply -f" in result.output
    docs = list(yaml.safe_load_all((out / "admission-webhook.yaml").read_text()))
    assert {w["clientConfig"]["caBundle"] for d in docs for w in d["webhooks"]} == {
        base64.b64encode((out / "ca.crt").read_bytes()).decode()}
    bad = CliRunner().invoke(app, ["webhook", "certs", str(out), "--url", "http://127.0.0.1:9443"])
    assert bad.exit_code == 2 and "must be https://HOST[:PORT]" in bad.output
