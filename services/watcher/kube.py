"""A thin JSON-over-HTTP layer on kubernetes-asyncio's ApiClient.

The watcher works on the API server's JSON as plain dicts (what normalize.py reads), for every
resource alike (core, batch, CRDs), so it uses the client's transport, auth and TLS but not its
generated models. Non-2xx answers become ``KubeError`` with the status and the Status message.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from kubernetes_asyncio import client


class KubeError(Exception):
    """The API server answered with a non-2xx status."""

    def __init__(self, status: int, reason: str, message: str = "", body: Any = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body

    @property
    def temporary(self) -> bool:
        """Worth retrying after a backoff (overload, server errors, timeouts)."""
        return self.status in (0, 429, 500, 502, 503, 504)


class Gone(KubeError):
    """410: the resourceVersion is older than the server keeps (compaction, watch cache)."""


def _error(status: int, reason: str, body: Any) -> KubeError:
    message = body.get("message", "") if isinstance(body, dict) else str(body or "")[:500]
    cls = Gone if status == 410 else KubeError
    return cls(status, reason, message, body)


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str
    ca_file: str | None = None
    verify_tls: bool = True


def api_client(creds: Credentials) -> client.ApiClient:
    cfg = client.Configuration(host=creds.server, api_key={"BearerToken": creds.token},
                               api_key_prefix={"BearerToken": "Bearer"})
    cfg.ssl_ca_cert = creds.ca_file
    cfg.verify_ssl = creds.verify_tls
    return client.ApiClient(configuration=cfg)


def resource_path(group: str, version: str, plural: str, namespace: str | None = None,
                  name: str | None = None, subresource: str | None = None) -> str:
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    if namespace:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    if name:
        base += f"/{quote(name)}"
    if subresource:
        base += f"/{subresource}"
    return base


class Kube:
    """JSON requests and watch streams against one API server."""

    def __init__(self, api: client.ApiClient, *, request_timeout_s: float = 30.0) -> None:
        self._api = api
        self._timeout_s = request_timeout_s

    async def close(self) -> None:
        await self._api.close()

    async def _raw(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                   body: Any = None, content_type: str = "application/json",
                   timeout: aiohttp.ClientTimeout | float | None = None) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        q = [(k, _qs(v)) for k, v in (query or {}).items() if v is not None]
        return await self._api.call_api(
            path, method, query_params=q, header_params=headers, body=body,
            auth_settings=["BearerToken"], _preload_content=False,
            _request_timeout=timeout if timeout is not None else self._timeout_s,
        )

    async def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                      body: Any = None, content_type: str = "application/json",
                      timeout: float | None = None) -> dict[str, Any]:
        resp = await self._raw(method, path, query=query, body=body, content_type=content_type,
                               timeout=timeout)
        try:
            data = await resp.read()
        finally:
            resp.release()
        try:
            parsed: Any = orjson.loads(data) if data else {}
        except orjson.JSONDecodeError:
            if 200 <= resp.status < 300:
                raise
            parsed = data.decode(errors="replace")  # e.g. "404 page not found" for unknown groups
        if not 200 <= resp.status < 300:
            raise _error(resp.status, resp.reason or "", parsed)
        return parsed

    async def get(self, path: str, **query: Any) -> dict[str, Any]:
        return await self.request("GET", path, query=query)

    async def serves(self, group: str, version: str, plural: str) -> bool:
        """Whether the API server serves this resource (API discovery, readable by anyone
        authenticated, so no RBAC on CRDs is needed)."""
        try:
            doc = await self.get(resource_path(group, version, "").rstrip("/"))
        except KubeError as e:
            if e.status in (404, 503):
                return False
            raise
        return any(r.get("name") == plural for r in doc.get("resources") or [])

    async def watch(self, path: str, *, resource_version: str, timeout_s: int,
                    bookmarks: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events ({"type", "object"}) until the server ends the stream.

        The server ends it after ``timeout_s``; the client gives up if nothing at all arrives
        for ``timeout_s + 30`` (bookmarks come about once a minute even when nothing changes).
        """
        query = {"watch": "true", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true" if bookmarks else None, "timeoutSeconds": timeout_s}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=timeout_s + 30)
        resp = await self._raw("GET", path, query=query, timeout=timeout)
        try:
            if not 200 <= resp.status < 300:
                data = await resp.read()
                try:
                    body: Any = orjson.loads(data) if data else {}
                except orjson.JSONDecodeError:
                    body = data.decode(errors="replace")
                raise _error(resp.status, resp.reason or "", body)
            while True:
                line = await resp.content.readline()
                if not line:
                    return
                line = line.strip()
                if line:
                    yield orjson.loads(line)
        finally:
            resp.release()
            resp.close()


def _qs(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


async def sleep_backoff(attempt: int, *, base_s: float = 0.5, cap_s: float = 30.0) -> None:
    """Exponential backoff with full jitter (attempt 0 → up to base_s)."""
    import random

    await asyncio.sleep(random.uniform(0, min(cap_s, base_s * (2**attempt))))
