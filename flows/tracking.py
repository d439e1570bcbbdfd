"""MLflow tracking: one experiment per swarm, a parent run, a nested run per node.

Runs are found again by tags, so a resumed node keeps logging into its run. Logging never
stops a node: a tracking store that fails (a locked SQLite file, a server down) costs a
warning and a few retries, not the round. This module is the one layer that retries MLflow
calls, under a ``RetryPolicy`` (ledger/retrying.py says which layer retries what).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
import time
from collections.abc import Callable, Mapping
from importlib.metadata import version as _version
from pathlib import Path
from typing import Any, TypeVar

from flows.config import TRACKING_RETRY
from ledger.retrying import RetryPolicy, call_with_retry, first_line
from ledger.schema import sharing_label

log = logging.getLogger(__name__)
T = TypeVar("T")

HEAVY_ATTEMPTS = 2
"""Uploading artifacts and registering models: a second try at most, they are slow."""
AWAY_S = 60.0
"""After a call failed every attempt, the tracker's later calls fail at once for this long:
a server that is down costs a round one call's retries, not every call's."""
CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "60"}
"""MLflow's own HTTP retries (7, backing off to ~4 minutes a call) under `attempt`'s would
hold a round for an hour against a server that is down: this module retries, the client
tries once, and waits at most a minute for an answer. A user's own settings win."""


MODEL_PATH_TAG = "sapo.model_path"
"""The run's tag naming the artifact path of its newest logged model."""


def attempt(call: Callable[[], T], what: str, policy: RetryPolicy = TRACKING_RETRY) -> T | None:
    """``call()`` retried under ``policy``; after the last attempt, a warning and None.

    MLflow raises many kinds of errors for a busy or absent store, so any Exception is
    retried: logging never stops a node. An ImportError is not a busy store but a missing
    install (MLflow comes with the `flows` extra): it is raised at once.
    """
    try:
        return call_with_retry(
            policy, call, (Exception,), f"tracking: {what}", log, never=(ImportError,)
        )
    except ImportError:
        raise
    except Exception as exc:
        log.warning(
            "tracking: %s failed after %d attempts: %s", what, policy.attempts, first_line(exc)
        )
        return None


def _heavy(policy: RetryPolicy) -> RetryPolicy:
    return policy.model_copy(update={"attempts": min(policy.attempts, HEAVY_ATTEMPTS)})


def existing_store(uri: str) -> str:
    """``uri``, a tracking store to read, if it exists; ValueError (one line) otherwise.
    Reading must not create: MLflow makes an empty SQLite file (and its folders) for a
    mistyped path, or an empty file store, and then answers that it holds no runs. A
    server's URI is left to the call (an unreachable one fails there)."""
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise ValueError(f"no MLflow store at {path} ({uri}): give an existing mlflow.db")
    elif uri.startswith("file:") or ("://" not in uri and not uri.startswith("databricks")):
        path = Path(uri.removeprefix("file://").removeprefix("file:"))
        if not path.is_dir():
            raise ValueError(f"no MLflow store at {path} ({uri}): give an existing folder")
    return uri


GENERATION = {"max_new_tokens": 64, "do_sample": False, "temperature": 1.0, "top_p": 1.0}
"""What a logged model generates as a pyfunc unless the caller's params say otherwise:
greedy, up to 64 new tokens, the completion alone (not the prompt before it)."""


def flatten(prefix: str, value: Any) -> dict[str, str]:
    """Nested config -> flat MLflow params ("grpo.learning_rate": "2e-05")."""
    if isinstance(value, Mapping):
        out: dict[str, str] = {}
        for key, inner in value.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), inner))
        return out
    return {prefix: str(value)[:6000]}


class Tracker:
    """A thin client over one experiment."""

    _away_until = 0.0
    """Until when (time.monotonic) the store is taken to be away (`AWAY_S`)."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        artifact_location: str | None = None,
        retry: RetryPolicy = TRACKING_RETRY,
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.retry = retry
        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_id = self._experiment(experiment, artifact_location)

    def _attempt(
        self, call: Callable[[], T], what: str, policy: RetryPolicy, *, even_if_away: bool = False
    ) -> tuple[bool, T | None]:
        """`attempt`: whether the call succeeded, and what it returned. Skipped (failed at
        once) while the store is known to be away (`AWAY_S`), unless ``even_if_away``."""
        if not even_if_away and time.monotonic() < self._away_until:
            log.debug("tracking: %s skipped, the store is away", what)
            return False, None
        done = attempt(lambda: (call(),), what, policy)
        if done is None:
            self._away_until = time.monotonic() + AWAY_S
            return False, None
        return True, done[0]

    def _experiment(self, name: str, artifact_location: str | None) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name, artifact_location=artifact_location))
        except Exception:  # another node created it first
            again = self.client.get_experiment_by_name(name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _find(self, tags: Mapping[str, str]) -> str | None:
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def run(
        self,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        parent_id: str | None = None,
    ) -> str | None:
        """The run with these identifying tags, created (with params) if new; None, with a
        warning, when the store stays unreachable (the caller goes on untracked)."""
        return self._attempt(
            lambda: self._find_or_create(name, tags, params, parent_id),
            f"open run {name}",
            self.retry,
        )[1]

    def _find_or_create(
        self,
        name: str,
        tags: Mapping[str, str],
        params: Mapping[str, str] | None,
        parent_id: str | None,
    ) -> str:
        existing = self._find(tags)
        if existing is not None:
            self.client.update_run(existing, status="RUNNING")
            return existing
        all_tags = dict(tags)
        if parent_id:
            all_tags["mlflow.parentRunId"] = parent_id
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        run_id = str(run.info.run_id)
        if params:
            from mlflow.entities import Param

            items = [Param(k, v) for k, v in params.items()]
            for lo in range(0, len(items), 100):
                self.client.log_batch(run_id, params=items[lo : lo + 100])
        return run_id

    def log_metrics(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        step: int,
        timestamp_ms: int | None = None,
    ) -> bool:
        """Whether the store took them (flows/node/unlogged.py keeps those it did not).
        ``timestamp_ms``: when they were measured (default: now)."""
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        batch = [Metric(k, float(v), stamp, step) for k, v in metrics.items() if v is not None]
        # Tried even while the store is away: a node logs metrics once a round, and a
        # round's first call is what finds the store back.
        return self._attempt(
            lambda: self.client.log_batch(run_id, metrics=batch),
            "log metrics",
            self.retry,
            even_if_away=True,
        )[0]

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        batch = [RunTag(k, v) for k, v in tags.items()]
        self._attempt(lambda: self.client.log_batch(run_id, tags=batch), "set tags", self.retry)

    def log_artifacts(self, run_id: str, local_dir: str, path: str) -> str | None:
        """Upload a directory; the URI of what was logged, or None when it failed."""

        def upload() -> str:
            self.client.log_artifacts(run_id, local_dir, path)
            return f"runs:/{run_id}/{path}"

        return self._attempt(upload, "log artifacts", _heavy(self.retry))[1]

    def log_model(
        self,
        run_id: str,
        model: Any,
        tokenizer: Any,
        scratch: Path,
        path: str = "model",
        prompt_template: str | None = None,
        stop: tuple[str, ...] = (),
    ) -> str | None:
        """Log a causal LM in MLflow's transformers flavor at the run's artifact ``path``,
        so that `mlflow.transformers.load_model` and `mlflow.pyfunc.load_model` load it (and
        the registered versions made from it), and tag the run with that path
        (`MODEL_PATH_TAG`: what `register_best` registers). ``prompt_template`` (with one
        ``{prompt}``: the node's prompt, `prompts.serving_template`) wraps what the pyfunc
        is given, and its generation ends at a ``stop`` text (the plain format's
        `</answer>`) as the node's does; the flavor's pipeline takes its input as is, with
        no stop text. Saved under `scratch` first,
        then uploaded. Returns its ``runs:/`` URI, or None when the upload failed."""
        import mlflow.transformers
        import torch
        import transformers

        # Its warnings are about the Hugging Face Hub (no model card or licence for a local
        # model): noise in every run's output.
        logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)
        # Saving imports transformers' quantisation integrations, and bitsandbytes (the gpu
        # extra) then warns on a CPU that an optional kernel package is missing: noise too.
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        from sapo_core.policy import adapter

        # An adapted model is logged as its adapter (megabytes) with the tokenizer, naming
        # the local directory of its frozen base: the flavor loads that base and applies the
        # adapter (a peft model in the pipeline); the adapter's own config names the base
        # model's id, for `peft` anywhere.
        base = (
            {"base_model_path": adapter.base_directory(model)} if adapter.is_adapted(model) else {}
        )
        # Served as a pyfunc (`mlflow.pyfunc.load_model`, `mlflow models serve`) it generates
        # GENERATION's defaults; a caller's `params` (max_new_tokens, do_sample, temperature,
        # top_p) override them, which the signature must declare to be accepted.
        from mlflow.models import infer_signature

        signature = infer_signature(["What is 1 + 1?"], ["2"], params=dict(GENERATION))
        with tempfile.TemporaryDirectory(dir=scratch, prefix=".mlflow-model-") as tmp:
            saved = Path(tmp) / "model"
            # Requirements named here: inferring them imports every optional module
            # transformers knows (torchvision, ...) and fails where they are absent.
            mlflow.transformers.save_model(
                transformers_model={"model": model, "tokenizer": tokenizer},
                path=str(saved),
                task="text-generation",
                signature=signature,
                model_config={
                    **GENERATION,
                    "return_full_text": False,
                    **({"stop_sequence": list(stop)} if stop else {}),
                },
                prompt_template=prompt_template,
                pip_requirements=[
                    f"torch=={torch.__version__.split('+')[0]}",
                    f"transformers=={transformers.__version__}",
                    *([f"peft=={_version('peft')}"] if base else []),
                ],
                **base,
            )
            logged = self.log_artifacts(run_id, str(saved), path)
        if logged is not None:
            self.set_tags(run_id, {MODEL_PATH_TAG: path})
        return logged

    def run_data(self, run_id: str) -> Any:
        """The run's params and tags (``.params``, ``.tags``); None when the store did not
        answer."""
        run = self._attempt(lambda: self.client.get_run(run_id), "read the run", self.retry)[1]
        return None if run is None else run.data

    def tag(self, run_id: str, key: str) -> str | None:
        """A tag of the run (None: not set, or the store did not answer)."""
        run = self._attempt(lambda: self.client.get_run(run_id), "read the run", self.retry)[1]
        return None if run is None else run.data.tags.get(key)

    def log_table(self, run_id: str, rows: list[dict[str, Any]], artifact_file: str) -> None:
        """A table (``rows``: one dict per row) as a run's artifact (``artifact_file``, a
        .json file), shown in MLflow's UI; nothing when there are no rows. A table logged
        again replaces the one there: MLflow's ``log_table`` appends to a file that exists,
        which doubled a round's rows each time a resumed node replayed the round, or a retry
        followed an upload that went through."""
        if not rows:
            return
        columns = {key: [row[key] for row in rows] for key in rows[0]}

        def log() -> None:
            folder = posixpath.dirname(artifact_file) or None
            if artifact_file not in {f.path for f in self.client.list_artifacts(run_id, folder)}:
                self.client.log_table(run_id, columns, artifact_file)
                return
            # The file as log_table writes it (pandas' "split" JSON, which load_table reads),
            # uploaded over the old one; the run's tag naming it as a table is already set.
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / posixpath.basename(artifact_file)
                table = {"columns": list(columns), "data": [[r[k] for k in columns] for r in rows]}
                path.write_text(json.dumps(table))
                self.client.log_artifact(run_id, str(path), folder)

        self._attempt(log, "log table", self.retry)

    def finish(self, run_id: str, status: str = "FINISHED") -> None:
        self._attempt(lambda: self.client.set_terminated(run_id, status), "finish run", self.retry)

    def children(self, parent_id: str) -> list[Any]:
        """The nested runs of a parent run."""
        query = f"tags.`mlflow.parentRunId` = '{parent_id}'"
        return list(self.client.search_runs([self.experiment_id], filter_string=query))

    def register(self, name: str, run_id: str, path: str = "model") -> str:
        """The version of registered model `name` that holds the artifacts a run logged at
        path: a new one, unless that model is already a version of `name` (registering it
        again is a no-op, not another copy)."""
        return self.ensure_registered(name, run_id, path)[0]

    def ensure_registered(self, name: str, run_id: str, path: str = "model") -> tuple[str, bool]:
        """`register`, and whether the version is new (False: the model already was one)."""
        from mlflow.exceptions import MlflowException

        source = f"{self.client.get_run(run_id).info.artifact_uri}/{path}"
        # run ids are hex: safe in a filter string; names are compared here, not quoted
        found = self.client.search_model_versions(f"run_id = '{run_id}'")
        same = [v for v in found if v.name == name and v.source == source]
        if same:
            return str(min(int(v.version) for v in same)), False
        try:
            self.client.create_registered_model(name)
        except MlflowException as exc:
            if "already exists" not in str(exc).lower():
                raise
        version = self.client.create_model_version(name, source, run_id=run_id)
        return str(version.version), True


def sharing_tags(local_groups: int, external_groups: int, policy: str) -> dict[str, str]:
    """Tags that line runs up in MLflow's compare view by sharing configuration."""
    return {
        "sapo.sharing": sharing_label(local_groups, external_groups),
        "sapo.local_groups": str(local_groups),
        "sapo.external_groups": str(external_groups),
        "sapo.sampling_policy": policy,
    }


def register_best(
    tracker: Tracker, parent_id: str, name: str, metric: str = "cumulative_own_reward"
) -> tuple[str, str, str] | None:
    """Register the model of the parent's child run with the highest `metric`.

    Returns (node id, run id, version), or None when no child logged a model."""
    best: tuple[float, Any] | None = None
    children = attempt(lambda: tracker.children(parent_id), "read the node runs", tracker.retry)
    for run in children or []:
        value = run.data.metrics.get(metric)
        if value is not None and (best is None or value > best[0]):
            best = (value, run)
    if best is None:
        return None
    run = best[1]
    path = run.data.tags.get(MODEL_PATH_TAG, "model")
    version = attempt(
        lambda: tracker.register(name, run.info.run_id, path),
        "register model",
        _heavy(tracker.retry),
    )
    if version is None:
        return None
    return run.data.tags.get("sapo.node_id", run.info.run_name), run.info.run_id, version


def open_tracker(
    uri: str,
    experiment: str,
    artifact_location: str | None,
    retry: RetryPolicy = TRACKING_RETRY,
) -> Tracker:
    """A tracker, with telemetry off before MLflow is imported and MLflow's client set to
    try each request once (`CLIENT_DEFAULTS`)."""
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    for name, value in CLIENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    tracker = attempt(
        lambda: Tracker(uri, experiment, artifact_location, retry), "open tracking", retry
    )
    if tracker is None:
        raise RuntimeError(f"cannot open the MLflow tracking store at {uri}")
    return tracker


__all__ = [
    "MODEL_PATH_TAG",
    "TRACKING_RETRY",
    "Tracker",
    "attempt",
    "flatten",
    "open_tracker",
    "register_best",
    "sharing_tags",
]
