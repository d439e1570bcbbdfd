"""Configuration of the ledger: where it lives and what a reader accepts from peers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from ledger.retrying import RetryPolicy

DEFAULT_WORKDIR = Path("sapo-work")
"""Where a swarm keeps its ledger, MLflow store and checkpoints unless told. Written here
once: the ledger's default lives under it, and `flows` (the swarm file, the command line)
takes it from here."""


class _Strict(BaseModel):
    # Unknown keys are an error, never silently ignored.
    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Self:
        """Load from a YAML file; unknown keys and out-of-bounds values raise."""
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)


class RowLimits(_Strict):
    """Bounds on what a peer may write. Rows over them are skipped with a counted reason."""

    max_id_chars: int = Field(128, ge=8, le=4096, description="Longest rollout_id / group_id.")
    max_question_chars: int = Field(16_384, ge=1, description="Longest question text.")
    max_answer_chars: int = Field(4_096, ge=1, description="Longest ground-truth answer.")
    max_completion_chars: int = Field(32_768, ge=1, description="Longest completion text.")
    max_metadata_chars: int = Field(65_536, ge=2, description="Longest metadata JSON.")
    max_task_config_chars: int = Field(8_192, ge=2, description="Longest task_config JSON.")
    max_completion_tokens: int = Field(65_536, ge=1, description="Largest completion_tokens claim.")
    max_group_size: int = Field(256, ge=1, description="Most completions in one group.")
    max_file_bytes: int = Field(256 * 2**20, ge=1024, description="Largest Parquet object read.")
    max_file_rows: int = Field(
        1_000_000, ge=1, description="Most rows in one Parquet object (by its footer)."
    )
    max_row_groups: int = Field(
        4_096, ge=1, description="Most row groups in one Parquet object (by its footer)."
    )
    max_uncompressed_bytes: int = Field(
        512 * 2**20,
        ge=1024,
        description="Most bytes the public columns of one Parquet object decompress to (by its "
        "footer): a small file may expand a thousandfold.",
    )
    max_text_bytes: int = Field(
        512 * 2**20,
        ge=1024,
        description="Most bytes the text columns of one Parquet object decode to, a "
        "dictionary-encoded value counted every time it occurs (the footer counts a "
        "dictionary once: one long string repeated a million times looks small there).",
    )
    max_footer_bytes: int = Field(
        2**20,
        ge=1024,
        description="Largest Parquet footer read (its length is in the file's last 8 bytes, "
        "checked before it is parsed): thousands of row groups of many columns make a "
        "footer of 100 MB whose every parse costs seconds. Honest files' are a few KB.",
    )


class ChangeLogConfig(_Strict):
    """The change log (ledger/changes.py): how readers learn of new objects without listing
    the whole store on every refresh."""

    use: Literal["auto", "on", "off"] = Field(
        "auto",
        description="auto: on for S3 (a listing costs a request per 1,000 keys), off for a "
        "local directory (listed cheaply by directory mtimes). Writers write markers only "
        "when it is on, so every node of a swarm should agree.",
    )
    grace_s: float = Field(
        10.0,
        ge=0.0,
        description="Each poll lists again the markers stamped this long before the reader's "
        "clock: a PUT that was slow to land, or a writer whose clock lags by less, is still "
        "caught. S3 and MinIO list a completed PUT at once; NTP keeps clocks within "
        "milliseconds. Each poll costs a request per 1,000 markers written in this window.",
    )
    full_listing_every_s: float = Field(
        3600.0,
        gt=0.0,
        description="Reconcile with a full listing this often: it catches objects written "
        "without a marker (an older writer, a peer that skipped it, a clock far behind).",
    )
    future_tolerance_s: float = Field(
        300.0,
        ge=0.0,
        description="Markers stamped further ahead of this reader's clock wait until their "
        "time comes, so a peer's clock cannot move a reader's cursor past others' markers.",
    )


class LedgerConfig(_Strict):
    """Where the ledger lives and how it is read."""

    url: str = Field(
        str(DEFAULT_WORKDIR / "ledger"),
        description="Root of the ledger: a local path, file:// URL or s3://bucket/prefix.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Storage backend options (s3: key, secret, endpoint_url, region, ...).",
    )
    limits: RowLimits = Field(default_factory=RowLimits)  # type: ignore[arg-type]
    max_staleness_s: float = Field(
        0.0,
        ge=0.0,
        description="Reuse a listing this many seconds old instead of listing the store on "
        "every read (0: always list). SAPO nodes never wait for each other, so a few seconds "
        "of staleness cost nothing and spare a large bucket's listing.",
    )
    check_signatures: Literal["swarm", "required", "off"] = Field(
        "swarm",
        validation_alias=AliasChoices("check_signatures", "signatures"),  # its former name
        description="What this reader requires signed by each node's registered key "
        "(ledger/identity.py): 'swarm' what each swarm's rules say (a swarm's own rule is "
        "the swarm file's `signatures`), 'required' every file, 'off' none (trust the paths).",
    )
    memory_limit_mb: int = Field(
        1024,
        ge=64,
        description="Most memory the ledger's DuckDB connection may take; a query over it "
        "fails with an out-of-memory error instead of exhausting the machine.",
    )
    change_log: ChangeLogConfig = Field(default_factory=ChangeLogConfig)  # type: ignore[arg-type]
    compact_at_files: int = Field(
        32,
        ge=0,
        description="A node merges its own partitions, today's included, once one of them "
        "holds this many small files (0: never; `sapo ledger compact` does it by hand). "
        "Readers keep reading while it runs and never see a merged row twice.",
    )
    reader_index: bool = Field(
        True,
        description="Nodes keep what their reader examined in a local DuckDB file "
        "(<workdir>/reader-index/<swarm>/<node>.duckdb, ledger/reader_index.py), so that a "
        "restarted node samples again without re-examining the ledger.",
    )
    local_copies: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Read each new rollout file in one GET into a local copy, and check, "
        "index and serve it from there (ledger/copies.py); 'auto': on for S3, off for a "
        "local folder. Costs local disk the size of the files read; saves the round trips "
        "DuckDB makes to read a remote file, at every refresh and every sample.",
    )
    retry: RetryPolicy = Field(
        default_factory=RetryPolicy,
        description="The one retry layer of storage reads and writes: a read that meets a "
        "vanished file (compaction), an I/O error or an unreachable store lists the store "
        "again and reads again; a write-once publish is retried the same way.",
    )
