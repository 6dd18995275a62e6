"""`qm webhook certs`: TLS for the admission webhook, and its configurations to apply."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import typer
import yaml

from services.admission.webhook_certs import issue, service_names, with_ca_bundle

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "admission-webhook.yaml"

webhook_app = typer.Typer(help="The admission webhook (validating: policies; mutating: suspend queued Jobs).",
                          no_args_is_help=True)


@webhook_app.command("certs")
def certs(
    out: Annotated[Path, typer.Argument(help="Directory to write ca.crt, tls.crt, tls.key and admission-webhook.yaml.")],
    service: Annotated[str, typer.Option(help="The admission Service's name.")] = "quartermaster-admission",
    namespace: Annotated[str, typer.Option(help="The admission Service's namespace.")] = "quartermaster-system",
    host: Annotated[list[str] | None, typer.Option(
        "--host", help="More names or IP addresses for the certificate (repeatable), e.g. 127.0.0.1 when the "
        "service runs outside the cluster.")] = None,
    url: Annotated[str | None, typer.Option(
        help="Call the webhook at this https:// base URL instead of the in-cluster Service (the admission "
        "service outside the cluster).")] = None,
    days: Annotated[int, typer.Option(min=1, help="Validity of both certificates.")] = 365,
    manifest: Annotated[Path, typer.Option(help="The webhook configurations to fill in.")] = MANIFEST,
) -> None:
    """Make a CA and a serving certificate signed by it, and write the webhook configurations
    with that CA as their caBundle. For clusters without cert-manager (which injects the CA
    itself: apply deploy/kubernetes/admission-webhook.yaml as it is there)."""
    target = urlsplit(url) if url is not None else None
    if target is not None and (target.scheme != "https" or not target.hostname):
        typer.echo(f"qm webhook certs: --url must be https://HOST[:PORT] (the API server calls webhooks over "
                   f"TLS only), not {url!r}", err=True)
        raise typer.Exit(2)
    if not manifest.is_file():
        typer.echo(f"qm webhook certs: no manifest at {manifest}; pass --manifest with the path of "
                   f"deploy/kubernetes/admission-webhook.yaml", err=True)
        raise typer.Exit(2)
    hosts = [*service_names(service, namespace), *(host or [])]
    if target is not None:
        hosts.append(target.hostname)
    tls = issue(hosts, days=days)
    documents = with_ca_bundle([d for d in yaml.safe_load_all(manifest.read_text()) if d], tls.ca_bundle, url=url)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ca.crt").write_bytes(tls.ca_cert)
    (out / "tls.crt").write_bytes(tls.cert)
    key = out / "tls.key"
    key.touch(mode=0o600, exist_ok=True)
    os.chmod(key, 0o600)
    key.write_bytes(tls.key)
    rendered = out / "admission-webhook.yaml"
    rendered.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    typer.echo(f"wrote {out}/ca.crt, tls.crt, tls.key (valid {days} days for {', '.join(dict.fromkeys(hosts))}) "
               f"and {rendered}")
    if target is not None:
        typer.echo(f"next: run the admission service with QM_WEBHOOK_PORT={target.port or 443} "
                   f"QM_WEBHOOK_CERT={out}/tls.crt QM_WEBHOOK_KEY={out}/tls.key, then kubectl apply -f {rendered}")
    else:
        typer.echo(f"next: kubectl -n {namespace} create secret tls {service}-tls --cert {out}/tls.crt "
                   f"--key {out}/tls.key, mount it in the admission pod (QM_WEBHOOK_CERT, QM_WEBHOOK_KEY), "
                   f"then kubectl apply -f {rendered}")


def register(app: typer.Typer) -> None:
    app.add_typer(webhook_app, name="webhook")
