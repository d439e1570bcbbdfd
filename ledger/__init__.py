"""The rollout ledger: Parquet files on an object store, queried with DuckDB.

No torch and no orchestration here: a person analysing a swarm's rollouts with SQL needs
only this package.

The names below load on first use (PEP 562), so that `ledger.config` (the settings and the
default work directory, which the command line reads before it parses anything) costs no
DuckDB or pyarrow import.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledger.catalog import RefreshStats
    from ledger.compaction import CompactionReport
    from ledger.config import LedgerConfig, RowLimits
    from ledger.draw_request import DrawRequest
    from ledger.identity import IdentityError, NodeKey
    from ledger.ledger import Ledger, ValidationReport
    from ledger.manifests import NodeManifest
    from ledger.policies import (
        FreshPolicy,
        PaperPolicy,
        RewardFilteredPolicy,
        SamplingPolicy,
        VarianceWeightedPolicy,
        parse_policy,
    )
    from ledger.records import RecordError
    from ledger.retrying import RetryPolicy
    from ledger.schema import COLUMN_NAMES, SCHEMA_VERSION
    from ledger.storage import StorageError, StoreUnusable

_HOMES = {
    "RefreshStats": "catalog",
    "CompactionReport": "compaction",
    "LedgerConfig": "config",
    "RowLimits": "config",
    "DrawRequest": "draw_request",
    "IdentityError": "identity",
    "NodeKey": "identity",
    "Ledger": "ledger",
    "ValidationReport": "ledger",
    "NodeManifest": "manifests",
    "FreshPolicy": "policies",
    "PaperPolicy": "policies",
    "RewardFilteredPolicy": "policies",
    "SamplingPolicy": "policies",
    "VarianceWeightedPolicy": "policies",
    "parse_policy": "policies",
    "RecordError": "records",
    "RetryPolicy": "retrying",
    "COLUMN_NAMES": "schema",
    "SCHEMA_VERSION": "schema",
    "StorageError": "storage",
    "StoreUnusable": "storage",
}

__all__ = [
    "COLUMN_NAMES",
    "SCHEMA_VERSION",
    "CompactionReport",
    "DrawRequest",
    "FreshPolicy",
    "IdentityError",
    "Ledger",
    "LedgerConfig",
    "NodeKey",
    "NodeManifest",
    "PaperPolicy",
    "RecordError",
    "RefreshStats",
    "RetryPolicy",
    "RewardFilteredPolicy",
    "RowLimits",
    "SamplingPolicy",
    "StorageError",
    "StoreUnusable",
    "ValidationReport",
    "VarianceWeightedPolicy",
    "parse_policy",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ledger' has no attribute {name!r}")
    value = getattr(import_module(f"ledger.{home}"), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
