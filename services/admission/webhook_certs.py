"""The webhook's TLS: a self-signed CA, a serving certificate it signs, and the webhook
configurations with that CA as their caBundle (`qm webhook certs`).

The API server calls admission webhooks over HTTPS only, and checks the serving certificate
against the caBundle of each webhook's clientConfig by its subjectAltNames (never the common
name). cert-manager does this in most clusters; this is the path for clusters without it, and
for running the admission service outside the cluster (`--url`), as the tests do.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ipaddress
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

WEBHOOK_KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")
CERT_MANAGER_ANNOTATION = "cert-manager.io/inject-ca-from"


@dataclass(frozen=True)
class WebhookTLS:
    """PEM bytes: the CA's certificate (the caBundle), the serving certificate and its key."""

    ca_cert: bytes
    cert: bytes
    key: bytes

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_cert).decode()


def service_names(service: str, namespace: str) -> list[str]:
    """The DNS names the API server may use for an in-cluster Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def issue(hosts: list[str], *, days: int = 365, now: dt.datetime | None = None) -> WebhookTLS:
    """A new CA (P-256) and a serving certificate for `hosts` (DNS names or IP addresses),
    both valid for `days` from five minutes ago (room for clock skew)."""
    if not hosts:
        raise ValueError("a serving certificate needs at least one host name or IP address")
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")
    start = (now or dt.datetime.now(dt.UTC)) - dt.timedelta(minutes=5)
    end = start + dt.timedelta(days=days, minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "quartermaster-webhook-ca")])
    ca = (x509.CertificateBuilder()
          .subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in dict.fromkeys(hosts)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return WebhookTLS(
        ca_cert=ca.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()),
    )


def with_ca_bundle(documents: list[dict[str, Any]], ca_bundle: str, *, url: str | None = None
                   ) -> list[dict[str, Any]]:
    """The webhook configurations among `documents` with `ca_bundle` in every clientConfig (and
    cert-manager's injection annotation dropped: the CA is ours now). With `url`, each webhook
    calls `url` + its service path instead of the in-cluster Service, and the Service itself is
    left out; other documents are kept as they are."""
    out = []
    for doc in documents:
        if doc.get("kind") == "Service" and url:
            continue
        doc = copy.deepcopy(doc)
        if doc.get("kind") in WEBHOOK_KINDS:
            (doc.get("metadata") or {}).get("annotations", {}).pop(CERT_MANAGER_ANNOTATION, None)
            if not (doc.get("metadata") or {}).get("annotations"):
                (doc.get("metadata") or {}).pop("annotations", None)
            for webhook in doc.get("webhooks") or []:
                client = webhook.setdefault("clientConfig", {})
                if url:
                    path = (client.pop("service", None) or {}).get("path", "")
                    client["url"] = url.rstrip("/") + path
                client["caBundle"] = ca_bundle
        out.append(doc)
    return out
