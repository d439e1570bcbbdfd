"""One retry policy for the I/O boundary, and the one place that says who retries what.

Each kind of failure is retried by exactly one layer, the innermost one that can do
something about it. Layers that stack their own loops multiply: four Prefect retries of a
sample, around four ledger re-reads, around six catalog re-lists, once listed a failing store
96 times.

- Storage reads and writes: the ledger (``LedgerConfig.retry``). A read that meets a file
  that vanished (compaction), an I/O error or an unreachable store lists the store again and
  reads again, ``attempts`` times in all, then raises a one-line ``StorageError``. A write
  (``put_new``, write-once, so a retry is a no-op) is retried the same way.
- MLflow calls: ``flows.tracking``, with its own ``RetryPolicy``. After the last attempt it
  logs a warning and gives up: tracking never stops a node.
- Prefect tasks: no retries. The flow records each step once; the layer inside has already
  retried, and what still fails after that needs a person, not a fourth loop.

Below these, the client libraries retry a single HTTP request on their own: botocore (for
s3fs's listings and writes; its ``max_attempts``, settable with ``storage_options``
``config_kwargs``) and DuckDB's httpfs for reads. s3fs's own retry loop is set to one try
(``S3Settings.s3fs_retries``; ``retries`` in ``storage_options`` changes it) so it does not
multiply the ledger's. They cannot re-list, which is why the ledger's layer exists. Worst
case on a dead S3 endpoint: ``attempts`` x botocore's attempts requests per read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Self, TypeVar

import tenacity
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)
T = TypeVar("T")


class RetryPolicy(BaseModel):
    """How often, and how patiently, one layer retries a failing call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attempts: int = Field(
        default=4, ge=1, le=20, description="Tries in all, the first included (1: never retry)."
    )
    initial_wait_s: float = Field(
        default=0.2,
        ge=0.0,
        le=60.0,
        description="Wait before the second try; it doubles at each try.",
    )
    max_wait_s: float = Field(
        default=5.0, ge=0.0, le=600.0, description="Longest wait between two tries."
    )
    jitter_s: float = Field(
        default=0.2,
        ge=0.0,
        le=60.0,
        description="Up to this much random time added to each wait, so that nodes that "
        "failed together do not all retry at the same instant.",
    )

    @model_validator(mode="after")
    def _waits_in_order(self) -> Self:
        if self.max_wait_s < self.initial_wait_s:
            raise ValueError(
                f"max_wait_s ({self.max_wait_s}) is below initial_wait_s ({self.initial_wait_s})"
            )
        return self


def retrying(
    policy: RetryPolicy,
    retry_on: tuple[type[BaseException], ...],
    what: str,
    logger: logging.Logger = log,
    never: tuple[type[BaseException], ...] = (),
) -> tenacity.Retrying:
    """A tenacity ``Retrying`` that tries up to ``policy.attempts`` times while the call raises
    one of ``retry_on`` (and none of ``never``), logs each retry on ``logger`` and re-raises
    the last error."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        logger.info(
            "%s failed (try %d of %d): %s; retrying in %.2f s",
            what,
            state.attempt_number,
            policy.attempts,
            first_line(error) if error else "?",
            wait,
        )

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=tenacity.wait_exponential_jitter(
            multiplier=policy.initial_wait_s, max=policy.max_wait_s, jitter=policy.jitter_s
        ),
        retry=tenacity.retry_if_exception_type(retry_on)
        & tenacity.retry_if_not_exception_type(never),
        before_sleep=before_sleep,
        reraise=True,
    )


def call_with_retry(
    policy: RetryPolicy,
    call: Callable[[], T],
    retry_on: tuple[type[BaseException], ...],
    what: str,
    logger: logging.Logger = log,
    never: tuple[type[BaseException], ...] = (),
) -> T:
    """``call()``, retried under ``policy``; the last error propagates."""
    return retrying(policy, retry_on, what, logger, never)(call)


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (DuckDB's run over several), or its type."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


__all__ = ["RetryPolicy", "call_with_retry", "first_line", "retrying"]
