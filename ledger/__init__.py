"""The rollout ledger: Parquet files on an object store, queried with DuckDB.

No torch and no orchestration here: a person analysing a swarm's rollouts with SQL needs
only this package.
"""

from ledger.catalog import RefreshStats
from ledger.compaction import CompactionReport
from ledger.config import LedgerConfig, RowLimits
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

__all__ = [
    "COLUMN_NAMES",
    "SCHEMA_VERSION",
    "CompactionReport",
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
