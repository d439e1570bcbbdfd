"""S3 connection settings, resolved once and handed to both s3fs and DuckDB's httpfs.

Explicit ``storage_options`` win over the standard AWS environment variables, so a ledger URL
plus options fully describes where the data lives: AWS, MinIO or any S3-compatible server.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

_ALIASES = {
    "aws_access_key_id": "key",
    "access_key_id": "key",
    "aws_secret_access_key": "secret",
    "secret_access_key": "secret",
    "aws_session_token": "token",
    "session_token": "token",
    "region_name": "region",
    "aws_region": "region",
    "endpoint": "endpoint_url",
    "aws_endpoint_url": "endpoint_url",
}
_OWN = {
    "key",
    "secret",
    "token",
    "endpoint_url",
    "region",
    "url_style",
    "conditional_writes",
    "connect_timeout_s",
    "read_timeout_s",
}
_TRUE = {"1", "true", "yes", "on"}


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE


def _positive(given: Mapping[str, Any], name: str, default: float) -> float:
    value = float(given.get(name, default))
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@dataclass(frozen=True)
class S3Settings:
    key: str | None = None
    secret: str | None = None
    token: str | None = None
    endpoint_url: str | None = None
    region: str = "us-east-1"
    url_style: str = "path"
    """'path' suits MinIO and local servers; AWS accepts it too. 'vhost' for virtual hosts."""
    conditional_writes: bool = True
    """Ask the server to refuse overwrites (If-None-Match). Turn off for stores without it."""
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 10.0
    """Every storage request gives up after these (s3fs's botocore and DuckDB's httpfs): a
    server that accepts connections but never answers costs a retry, not a hung node."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further s3fs keyword arguments, passed through untouched."""

    @classmethod
    def resolve(
        cls, options: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
    ) -> S3Settings:
        env = os.environ if environ is None else environ
        given: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in (options or {}).items():
            canonical = _ALIASES.get(name, name)
            (given if canonical in _OWN else extra)[canonical] = value
        region = (
            given.get("region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
        ) or "us-east-1"
        url_style = str(given.get("url_style", "path"))
        if url_style not in ("path", "vhost"):
            raise ValueError(f"url_style must be 'path' or 'vhost', not {url_style!r}")
        return cls(
            key=given.get("key") or env.get("AWS_ACCESS_KEY_ID"),
            secret=given.get("secret") or env.get("AWS_SECRET_ACCESS_KEY"),
            token=given.get("token") or env.get("AWS_SESSION_TOKEN"),
            endpoint_url=given.get("endpoint_url")
            or env.get("AWS_ENDPOINT_URL_S3")
            or env.get("AWS_ENDPOINT_URL"),
            region=str(region),
            url_style=url_style,
            conditional_writes=_as_bool(given.get("conditional_writes", True)),
            connect_timeout_s=_positive(given, "connect_timeout_s", 5.0),
            read_timeout_s=_positive(given, "read_timeout_s", 10.0),
            extra=extra,
        )

    def s3fs_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            # Peers add files all the time: a cached listing would hide them.
            "use_listings_cache": False,
            "skip_instance_cache": True,
        }
        if self.key is not None:
            kwargs["key"] = self.key
            kwargs["secret"] = self.secret
        if self.token is not None:
            kwargs["token"] = self.token
        if self.endpoint_url is not None:
            kwargs["endpoint_url"] = self.endpoint_url
        client_kwargs = dict(self.extra.get("client_kwargs", {}))
        client_kwargs.setdefault("region_name", self.region)
        kwargs["client_kwargs"] = client_kwargs
        kwargs["config_kwargs"] = self._config_kwargs()
        kwargs.update(
            {
                k: v
                for k, v in self.extra.items()
                if k not in ("client_kwargs", "config_kwargs", "retries")
            }
        )
        return kwargs

    def _config_kwargs(self) -> dict[str, Any]:
        """botocore's Config: the timeouts, and its tries, under what the user passed."""
        config_kwargs = dict(self.extra.get("config_kwargs", {}))
        config_kwargs.setdefault("connect_timeout", self.connect_timeout_s)
        config_kwargs.setdefault("read_timeout", self.read_timeout_s)
        # botocore's own retries multiply the ledger's (ledger/retrying.py): two tries
        # per request bound a silent server to attempts x 2 x read_timeout_s.
        config_kwargs.setdefault("retries", {"max_attempts": 2, "mode": "standard"})
        return config_kwargs

    def put_timeout_s(self, size: int) -> float:
        """The longest a PUT of ``size`` bytes may take, botocore's tries included. A read
        timeout does not bound a PUT: the client waits for the server's `100 Continue`
        before it sends the body, with no timeout of its own, so a server that takes the
        request and never answers would hold the node for good. Each try gets its connect
        and read timeouts, and the body time at 50 kB/s (a slow link, not a stalled one)."""
        retries = self._config_kwargs()["retries"] or {}
        tries = int(retries.get("max_attempts", retries.get("total_max_attempts", 2)))
        per_try = self.connect_timeout_s + self.read_timeout_s + size / 50_000
        return max(tries, 1) * per_try

    @property
    def s3fs_retries(self) -> int:
        """Tries of s3fs's own loop around each call (an attribute, not a constructor
        argument). One by default: the ledger's RetryPolicy retries (and re-lists), and a
        second loop would multiply it; botocore still retries a single request."""
        return int(self.extra.get("retries", 1))

    def duckdb_secret_sql(self, scope: str | None = None, name: str = "sapo_ledger") -> str:
        """A ``CREATE SECRET`` statement that gives DuckDB's httpfs the same access."""
        parts = ["TYPE s3", f"REGION {_quote(self.region)}", f"URL_STYLE {_quote(self.url_style)}"]
        if self.key is not None:
            parts.append(f"KEY_ID {_quote(self.key)}")
            parts.append(f"SECRET {_quote(self.secret or '')}")
        if self.token is not None:
            parts.append(f"SESSION_TOKEN {_quote(self.token)}")
        if self.endpoint_url:
            parsed = urlparse(self.endpoint_url)
            host = parsed.netloc or parsed.path
            parts.append(f"ENDPOINT {_quote(host)}")
            parts.append(f"USE_SSL {'false' if parsed.scheme == 'http' else 'true'}")
        if scope:
            parts.append(f"SCOPE {_quote(scope)}")
        return f"CREATE OR REPLACE SECRET {name} ({', '.join(parts)})"
