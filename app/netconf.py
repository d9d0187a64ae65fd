"""How one provider is reached on the network: its proxy and its TLS trust, resolved once from the
provider's config and the environment, and handed to the HTTP client that reaches real upstreams
(the async driver's pyreqwest client, which the sync client runs too). Plain data: it imports no
HTTP client.

Proxies follow curl, requests and httpx: ``HTTPS_PROXY`` for an ``https://`` upstream,
``HTTP_PROXY`` for an ``http://`` one, ``ALL_PROXY`` for either (upper or lower case), and
``NO_PROXY`` (host names, domain suffixes, ``*``, addresses) exempts a host. ``[providers.NAME]
proxy = "http://..."`` overrides the environment for that provider and ``proxy = "none"`` turns
proxies off for it. The proxy is resolved here, not by either library, so an error can name it.
"""

from __future__ import annotations

import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = ["NetConf", "redact", "resolve"]


@dataclass(frozen=True, slots=True)
class NetConf:
    """One provider's network settings. ``proxy`` is the proxy URL in effect (None: direct) and
    ``proxy_source`` where it came from (``config``, or the environment variable's name)."""

    proxy: str | None = None
    proxy_source: str | None = None
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def ca_pem(self) -> bytes | None:
        return Path(self.ca_bundle).read_bytes() if self.ca_bundle else None

    def identity_pem(self) -> bytes | None:
        """The client certificate (its chain) as PEM."""
        return Path(self.client_cert).read_bytes() if self.client_cert else None

    def key_pem(self) -> bytes | None:
        """The client certificate's key: ``client_key``, or the key inside ``client_cert``."""
        if self.client_key:
            return Path(self.client_key).read_bytes()
        return self.identity_pem()

    def describe_proxy(self) -> str:
        """``proxy http://host:3128 (from HTTPS_PROXY)``, with any password hidden."""
        return f"proxy {redact(self.proxy or '')} (from {self.proxy_source})"


def redact(url: str) -> str:
    """``url`` without the password of its userinfo (``http://user:***@host:3128``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def resolve(
    base_url: str,
    *,
    proxy: str | None = None,
    ca_bundle: str | None = None,
    client_cert: str | None = None,
    client_key: str | None = None,
    environ: dict[str, str] | None = None,
) -> NetConf:
    """The network settings for an upstream at ``base_url``: the config's ``proxy`` ("none" = no
    proxy) or else the environment's, with ``NO_PROXY`` honoured."""
    tls = {"ca_bundle": ca_bundle, "client_cert": client_cert, "client_key": client_key}
    if proxy == "none":
        return NetConf(**tls)
    if proxy:
        return NetConf(proxy=proxy, proxy_source="config", **tls)
    parts = urlsplit(base_url)
    env = _proxy_env(environ)
    if not env or parts.hostname is None or _bypassed(parts.hostname, parts.port, env):
        return NetConf(**tls)
    for key in (parts.scheme, "all"):
        if env.get(key):
            return NetConf(proxy=env[key][0], proxy_source=env[key][1], **tls)
    return NetConf(**tls)


def _proxy_env(environ: dict[str, str] | None) -> dict[str, tuple[str, str]]:
    """``{scheme: (url, variable)}`` from the environment (lower case wins, as in curl)."""
    source = environ if environ is not None else dict(os.environ)
    out: dict[str, tuple[str, str]] = {}
    for name in sorted(source, key=lambda n: n.islower()):  # upper case first, lower case overrides
        if name.lower().endswith("_proxy") and source[name].strip():
            scheme = name.lower()[: -len("_proxy")]
            value = source[name].strip()
            if scheme != "no" and "://" not in value:
                value = "http://" + value  # curl's reading of a bare host:port
            out[scheme] = (value, name)
    return out


def _bypassed(host: str, port: int | None, env: dict[str, tuple[str, str]]) -> bool:
    no_proxy = env.get("no")
    if no_proxy is None:
        return False
    if no_proxy[0].strip() == "*":
        return True
    hostport = f"{host}:{port}" if port else host
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # public, untyped in typeshed
    return bool(bypass(hostport, {"no": no_proxy[0]}))
