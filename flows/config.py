"""Configuration of a swarm: one YAML file that names every node, with defaults for all.

    swarm_id: cpu-swarm
    rounds: 3
    sampling: {kind: paper}                                             # every node's policy
    defaults: {model: ..., local_groups: 2, external_groups: 2, ...}   # any NodeConfig field
    nodes:
      - {node_id: node-0, seed: 0}
      - {node_id: node-1, seed: 1, model: ./my-model, sampling: {kind: reward_filtered}}

The file is read once and resolved once: `defaults` and the swarm's `sampling` are merged
into each node by a before-validator, so a `SwarmConfig` holds typed nodes (`NodeSpec`:
a `NodeConfig` and a sampling policy model), a `LedgerConfig` and its tracking settings,
and nothing is re-validated at use. Every key is checked (unknown keys fail); `--set
a.b=value` overrides any of them. The resolved config dumps to a file any node process or
deployment loads as it is (`swarm_yaml`).
"""

from __future__ import annotations

import copy
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from flows.config_errors import describe_validation_error
from flows.limits import CHECKPOINT_KEEP_HELP, DEFAULT_WORKDIR, MAX_NODES
from flows.yaml_config import (
    ConfigError,
    apply_overrides,
    parse_yaml_mapping,
)
from ledger.config import LedgerConfig
from ledger.policies import PaperPolicy, SamplingPolicy, SqlPolicy
from ledger.policy_check import run_problem
from ledger.retrying import RetryPolicy
from ledger.schema import MAX_COUNTER, check_id
from sapo_core.config import NodeConfig, Strict
from sapo_core.rollouts import group_id_of, rollout_id_of

DEFAULT_SWARM = "cpu.yaml"
DEFAULT_NODE_COUNT = 3
DEFAULT_POLICY = str(PaperPolicy.model_fields["kind"].default)
"""The sampling policy of a swarm that names none: the paper's uniform draw."""
TRACKING_RETRY = RetryPolicy(attempts=5, initial_wait_s=0.2, max_wait_s=5.0, jitter_s=0.2)
"""MLflow calls: a busy SQLite file or a restarting server usually answers within seconds."""
WORKDIR_ENV = "SAPO_WORKDIR"
"""Where a worker machine's nodes keep their state, over the deployed swarm's workdir."""


class HomeConfig(Strict):
    """A store beyond the node's machine that holds each node's newest checkpoint and its
    signing key (flows/node/home.py): a node whose machine is lost continues on another."""

    url: str = Field(
        description="An fsspec URL: s3://bucket/prefix (a bucket no peer can read: it holds "
        "the nodes' private keys), or a folder every machine mounts."
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Options for the store (s3fs: endpoint_url, key, secret); default: the "
        "environment's (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...).",
    )


class TrackingConfig(Strict):
    """MLflow: where runs go. Null uri: a SQLite file under the working directory."""

    uri: str | None = Field(
        None,
        description="MLflow tracking URI (sqlite:///..., http://...); default: "
        "$MLFLOW_TRACKING_URI, else <workdir>/mlflow.db.",
    )
    experiment: str | None = Field(None, description="Experiment name; default: the swarm id.")
    artifact_location: str | None = Field(
        None, description="Where new experiments keep artifacts; default: <workdir>/mlartifacts."
    )
    log_models: bool | None = Field(
        None,
        description="Log each node's final model to its run. Default: yes, unless the swarm's "
        "checkpoint_keep is 'nothing' (then no model is kept anywhere; true keeps it in MLflow "
        "only).",
    )
    registered_model: str | None = Field(
        "",
        description="Register the model of the node with the highest cumulative_own_reward under "
        "this name when the swarm ends ('' : '<swarm_id>-policy'; null: register nothing).",
    )
    retry: RetryPolicy = Field(
        default_factory=lambda: TRACKING_RETRY,
        description="Retries of each MLflow call; after the last, a warning, never a failed round.",
    )
    enabled: bool = True


NODE_LISTING_STALENESS_S = 5.0
"""A swarm's nodes reuse a ledger listing up to this old (`ledger.max_staleness_s`): they never
wait for each other, and on a large bucket the listing is most of a draw's cost. A reader
outside a swarm (`sapo ledger query`) keeps LedgerConfig's default, 0: it always lists."""


class PrefectConfig(Strict):
    """Prefect: null api_url runs each node in Prefect's local ephemeral mode."""

    api_url: str | None = None


class NodeSpec(Strict):
    """A node of the swarm: its algorithm's config and the policy it samples peers with.

    Accepts the swarm file's flat form (NodeConfig fields plus `sampling`) or the resolved
    form `{node: {...}, sampling: {...}}` that `swarm_yaml` writes."""

    node: NodeConfig
    sampling: SamplingPolicy = Field(default_factory=PaperPolicy)  # type: ignore[arg-type]

    @model_validator(mode="before")
    @classmethod
    def _flat_form(cls, data: Any) -> Any:
        if isinstance(data, dict) and "node" not in data:
            rest = {k: v for k, v in data.items() if k != "sampling"}
            return {"node": rest, **({"sampling": data["sampling"]} if "sampling" in data else {})}
        return data

    @property
    def node_id(self) -> str:
        return self.node.node_id


class SwarmConfig(Strict):
    """A swarm: shared settings, the ledger, tracking, and every node resolved."""

    swarm_id: str = Field("cpu-swarm", description="An id (ledger.schema.check_id).")
    experiment: str | None = Field(
        None, description="The sweep this swarm belongs to (set by `sapo experiment`)."
    )
    workdir: Path = Field(
        DEFAULT_WORKDIR,
        description="Where ledger, MLflow store, checkpoints live.",
        validate_default=True,  # the default, relative, is made absolute like a given one
    )
    rounds: int = Field(3, ge=1, description="Rounds each node runs (in total, across resumes).")
    checkpoint_every: int = Field(
        1, ge=1, description="Checkpoint every K rounds; always at the end."
    )
    checkpoint_keep: Literal["resume", "final-model", "nothing"] = Field(
        "resume", description=CHECKPOINT_KEEP_HELP
    )
    checkpoint_home: HomeConfig | None = Field(
        None,
        description="Copy each node's newest checkpoint and signing key there after each "
        "checkpoint, and start a node from there when it is newer than this machine's: a "
        "node continues on another machine (docs/running.md). Null: this machine only.",
    )
    peer_wait_s: float = Field(
        0.0,
        ge=0.0,
        le=3600.0,
        description="When fewer than J peer groups exist yet, wait up to this long for them "
        "before training without (0: never wait; no node ever waits for a particular peer).",
    )
    stall_timeout_s: float | None = Field(
        1800.0,
        ge=1.0,
        le=7 * 86400.0,
        description="End a node run that makes no progress for this long (no step begun, "
        "no completion generated, no round ended; opening the node counts as a step, and "
        "the sample step may add peer_wait_s): its Prefect run is marked Crashed naming the "
        "step, its process exits with status 75, and the node's next run resumes from its "
        "checkpoint (flows/node/watchdog.py). null: never.",
    )
    ledger: LedgerConfig = Field(
        default_factory=LedgerConfig,  # type: ignore[arg-type]
        description="Where the ledger lives; url defaults to <workdir>/ledger.",
    )
    signatures: Literal["required", "open"] = Field(
        "required",
        description="The swarm's rule, declared by its first node: 'required' (readers skip "
        "files not signed by their node's registered key) or 'open' (anyone may write as "
        "any node). Each node's key is kept at <workdir>/keys/<swarm_id>/<node_id>.pem.",
    )
    membership: Literal["closed", "open"] | None = Field(
        None,
        description="closed: the swarm's rules list its nodes, and readers skip whatever any "
        "other node writes in it (rollouts, logs, a manifest that would join it); open: any "
        "node may join at any time. Default: closed for a swarm of `sapo experiment` (its "
        "sweep is fixed before it runs, and a stranger's manifest would change its report), "
        "open otherwise. Declared by the swarm's first node, like `signatures`.",
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)  # type: ignore[arg-type]
    prefect: PrefectConfig = Field(default_factory=PrefectConfig)
    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_NODES)

    def members(self) -> list[str] | None:
        """The node ids the swarm's rules list (closed), or None (open to any node)."""
        closed = self.membership == "closed" or (
            self.membership is None and self.experiment is not None
        )
        return [spec.node_id for spec in self.nodes] if closed else None

    @model_validator(mode="before")
    @classmethod
    def _resolve_nodes(cls, data: Any) -> Any:
        """Merge `defaults` and the swarm-wide `sampling` into every node entry (input-only
        keys), generate `node_count` nodes when none are listed, and default the ledger's
        url to <workdir>/ledger."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        defaults = data.pop("defaults", None) or {}
        sampling = data.pop("sampling", None) or {"kind": DEFAULT_POLICY}
        for name, value in (("defaults", defaults), ("sampling", sampling)):
            if not isinstance(value, dict):
                raise ValueError(f"{name} must be a mapping, got {value!r}")
        if "sampling" in defaults:
            raise ValueError("defaults.sampling: set the policy of every node as the top-level "
                             "`sampling`, or per node")  # fmt: skip
        data["nodes"] = [_merge_node(entry, defaults, sampling) for entry in node_entries(data)]
        ledger = data.get("ledger") or {}
        if isinstance(ledger, dict):
            ledger = {"max_staleness_s": NODE_LISTING_STALENESS_S, **ledger}
            if "url" not in ledger:
                workdir = Path(str(data.get("workdir", DEFAULT_WORKDIR))).expanduser().resolve()
                ledger["url"] = str(workdir / "ledger")
            data["ledger"] = ledger
        return data

    @field_validator("workdir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()  # node processes run from anywhere

    @field_validator("swarm_id", "experiment")
    @classmethod
    def _an_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else check_id(str(info.field_name), value)

    @model_validator(mode="after")
    def _ids_unique(self) -> Self:
        # Ids name the ledger's folders and objects: the ledger's one rule for them, here
        # where the swarm loads, so that a node never starts with one its ledger refuses.
        ids = [check_id("node_id", spec.node_id) for spec in self.nodes]
        most = self.ledger.limits.max_id_chars
        for spec in self.nodes:
            longest = longest_rollout_id(self.swarm_id, spec.node)
            if len(longest) > most:
                raise ValueError(
                    f"swarm_id and node_id {spec.node_id!r} are too long together: the node's "
                    f"rollout ids (such as {longest!r}, {len(longest)} characters) would "
                    f"exceed ledger.limits.max_id_chars ({most})"
                )
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"node ids repeat: {repeated}")
        return self

    def node(self, node_id: str) -> NodeSpec:
        for spec in self.nodes:
            if spec.node_id == node_id:
                return spec
        known = [spec.node_id for spec in self.nodes]
        raise ConfigError(f"no node {node_id!r} in swarm {self.swarm_id}; it has {known}")

    @property
    def logs_models(self) -> bool:
        """Whether its nodes log their final models to MLflow (and the best is registered):
        as `tracking.log_models` says, or, where it says nothing, unless the swarm keeps
        nothing (`checkpoint_keep: nothing` means no model, on disk or in MLflow)."""
        if not self.tracking.enabled:
            return False
        if self.tracking.log_models is not None:
            return self.tracking.log_models
        return self.checkpoint_keep != "nothing"

    def tracking_uri(self) -> str:
        """As configured, else $MLFLOW_TRACKING_URI (what `sapo infra up` exports for a
        tracking server), else a SQLite file in the working directory."""
        return (
            self.tracking.uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{self.workdir / 'mlflow.db'}"
        )

    def prefect_api_url(self) -> str | None:
        """As configured (`prefect.api_url`), else $PREFECT_API_URL (what `sapo infra up`
        exports), else None: Prefect's ephemeral mode."""
        return self.prefect.api_url or os.environ.get("PREFECT_API_URL") or None

    def tracks_on_server(self) -> bool:
        """Whether runs go to a tracking server rather than a local store."""
        return self.tracking_uri().startswith(("http://", "https://", "databricks"))

    def artifact_location(self) -> str | None:
        """Where a new experiment keeps its artifacts: as configured; for a local store,
        <workdir>/mlartifacts; for a tracking server, None (the server's own artifact
        root, which it may serve from a bucket)."""
        if self.tracking.artifact_location:
            return self.tracking.artifact_location
        if self.tracks_on_server():
            return None
        return (self.workdir / "mlartifacts").as_uri()


def longest_rollout_id(swarm_id: str, node: NodeConfig) -> str:
    """The longest rollout id the node can write (sapo_core/rollouts.py ``group_id_of``,
    ``rollout_id_of``), at the largest round a ledger accepts."""
    questions, completions = node.questions, node.generation.completions_per_question
    group = group_id_of(f"{swarm_id}.", node.node_id, MAX_COUNTER, questions - 1)
    return rollout_id_of(group, completions - 1)


def node_entries(data: dict[str, Any]) -> list[Any]:
    """The swarm data's node entries, `node_count` generated ones when none are listed
    (node-0, node-1, ... seeded 0, 1, ...); pops `node_count` from `data`."""
    count = data.pop("node_count", None)
    if count is not None and data.get("nodes"):
        raise ValueError("node_count: give either node_count or a list of nodes, not both")
    entries = data.get("nodes") or [
        {"node_id": f"node-{i}", "seed": i} for i in range(_count(count))
    ]
    if not isinstance(entries, list):
        raise ValueError("nodes must be a list of node entries")
    return entries


def _count(value: Any) -> int:
    if value is None:
        return DEFAULT_NODE_COUNT
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_NODES:
        raise ValueError(f"node_count must be an integer in [1, {MAX_NODES}], got {value!r}")
    return value


def _merge_node(entry: Any, defaults: dict[str, Any], sampling: dict[str, Any]) -> Any:
    """A node entry over the defaults; its own `sampling` keys over the swarm's."""
    if not isinstance(entry, dict):
        return entry  # NodeSpec reports the type error with its position
    if "node" in entry:  # already resolved (a file written by swarm_yaml)
        return entry
    if "node_id" not in entry:
        raise ValueError(f"a node entry has no node_id: {entry}")
    own = entry.get("sampling") or {}
    if not isinstance(own, dict):
        raise ValueError(f"node {entry['node_id']}: sampling must be a mapping, got {own!r}")
    # A node that names another policy kind does not inherit the swarm's policy parameters.
    base = sampling if own.get("kind", sampling.get("kind")) == sampling.get("kind") else {}
    merged = _deep_merge(defaults, {k: v for k, v in entry.items() if k != "sampling"})
    return {**merged, "sampling": _deep_merge(base, own)}


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# -- reading files --------------------------------------------------------------------------


def read_yaml_mapping(path: str | Path | None, *, what: str = "swarm file") -> dict[str, Any]:
    """A YAML file's top-level mapping (default: the embedded CPU swarm); errors name the file."""
    name = str(path) if path else f"embedded {DEFAULT_SWARM}"
    try:
        text = Path(path).read_text() if path else default_swarm_text()
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the {what}: {exc.strerror or exc}") from exc
    return parse_yaml_mapping(text, name, what=what)


def default_swarm_text() -> str:
    return resources.files("flows.swarms").joinpath(DEFAULT_SWARM).read_text()


def load_swarm(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    text: str | None = None,
    nodes: int | None = None,
    rounds: int | None = None,
    workdir: str | Path | None = None,
) -> SwarmConfig:
    """The swarm file (or its text; default: the embedded CPU swarm), resolved once.

    Flags win over `--set` overrides, which win over the file. Any problem raises
    ConfigError with one line naming the file and the key."""
    source = str(path) if path else ("swarm text" if text is not None else DEFAULT_SWARM)
    data = parse_yaml_mapping(text, source) if text is not None else read_yaml_mapping(path)
    data = apply_overrides(data, overrides or [])
    overridden = frozenset(item.partition("=")[0].strip() for item in overrides or [])
    if rounds is not None:
        data["rounds"] = rounds
    if workdir is not None:
        data["workdir"] = str(workdir)
    if nodes is not None:
        data["nodes"] = _first_nodes(data, nodes)
    base = Path(path).expanduser().resolve().parent if path else None
    return validate_swarm(data, source, overridden, base)


def validate_swarm(
    data: dict[str, Any],
    source: str = "swarm",
    overridden: frozenset[str] = frozenset(),
    base: Path | None = None,
) -> SwarmConfig:
    """``data`` as a swarm; files it names (a policy's SQL) are relative to ``base``, the
    swarm file's folder (else the working directory)."""
    try:
        config = SwarmConfig.model_validate(data, context={"base": base})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source, data, overridden)) from exc
    for spec in config.nodes:  # a user's SQL policy runs once before any node draws with it
        if isinstance(spec.sampling, SqlPolicy):
            problem = run_problem(spec.sampling)
            if problem:
                raise ConfigError(f"{source}: {spec.node_id}: sampling: {problem}")
    return config


def _first_nodes(data: dict[str, Any], count: int) -> list[Any]:
    """The file's first `count` nodes, topped up with node-<i> (seed i) entries."""
    listed = list(data.get("nodes") or [])
    extra = [{"node_id": f"node-{i}", "seed": i} for i in range(len(listed), count)]
    data.pop("node_count", None)
    return (listed + extra)[:count]


def swarm_yaml(config: SwarmConfig) -> str:
    """The resolved swarm as YAML: what node processes and deployments load unchanged."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
