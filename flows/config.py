"""Configuration of a swarm: one YAML file that names every node, with defaults for all.

    swarm_id: cpu-swarm
    rounds: 3
    defaults: {model: ..., local_groups: 2, external_groups: 2, ...}   # any NodeConfig field
    nodes:
      - {node_id: node-0, seed: 0}
      - {node_id: node-1, seed: 1, model: ./my-model, sampling: {kind: reward_filtered}}

Every key is validated (unknown keys fail); `--set a.b=value` overrides any of them.
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import Field, ValidationError, model_validator

from ledger import parse_policy
from ledger.config import LedgerConfig
from sapo_core.config import NodeConfig, Strict

DEFAULT_SWARM = "cpu.yaml"


class TrackingConfig(Strict):
    """MLflow: where runs go. Null uri: a SQLite file under the working directory."""

    uri: str | None = Field(None, description="MLflow tracking URI (sqlite:///..., http://...).")
    experiment: str | None = Field(None, description="Experiment name; default: the swarm id.")
    artifact_location: str | None = Field(
        None, description="Where new experiments keep artifacts; default: <workdir>/mlartifacts."
    )
    log_models: bool = Field(True, description="Log each node's final model to its run.")
    registered_model: str | None = Field(
        "",
        description="Register the model of the node with the highest cumulative reward under "
        "this name when the swarm ends ('' : '<swarm_id>-policy'; null: register nothing).",
    )
    enabled: bool = True


class PrefectConfig(Strict):
    """Prefect: null api_url runs each node in Prefect's local ephemeral mode."""

    api_url: str | None = None


class NodeSpec(Strict):
    """A node as the swarm file names it: NodeConfig fields plus its sampling policy."""

    node: NodeConfig
    sampling: dict[str, Any]


class SwarmConfig(Strict):
    """A swarm experiment: shared settings, defaults for every node, and the nodes."""

    swarm_id: str = Field("cpu-swarm", pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
    workdir: str = Field("sapo-work", description="Where ledger, MLflow store, checkpoints live.")
    rounds: int = Field(3, ge=1, description="Rounds each node runs (in total, across resumes).")
    checkpoint_every: int = Field(
        1, ge=1, description="Checkpoint every K rounds; always at the end."
    )
    peer_wait_s: float = Field(
        0.0,
        ge=0.0,
        le=3600.0,
        description="When fewer than J peer groups exist yet, wait up to this long for them "
        "before training without (0: never wait; no node ever waits for a particular peer).",
    )
    ledger: dict[str, Any] = Field(
        default_factory=dict, description="LedgerConfig fields; url defaults to <workdir>/ledger."
    )
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)  # type: ignore[arg-type]
    prefect: PrefectConfig = Field(default_factory=PrefectConfig)
    sampling: dict[str, Any] = Field(
        default_factory=lambda: {"kind": "paper"},
        description="Sampling policy of peers' groups (ledger policies), for every node.",
    )
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="NodeConfig fields every node starts from."
    )
    nodes: list[dict[str, Any]] = Field(
        default_factory=list, description="Per-node overrides; each needs a node_id."
    )
    node_count: int | None = Field(
        None, ge=1, le=256, description="Nodes node-0..node-(N-1) when `nodes` is empty."
    )

    @model_validator(mode="after")
    def _nodes_are_valid(self) -> Self:
        self.ledger_config()
        specs = self.node_specs()
        ids = [s.node.node_id for s in specs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"node ids repeat: {ids}")
        for spec in specs:
            try:
                parse_policy(spec.sampling)
            except ValidationError as exc:
                raise ValueError(
                    f"node {spec.node.node_id}: bad sampling policy {spec.sampling}: "
                    f"{exc.errors()[0]['msg']}"
                ) from exc
        return self

    def node_specs(self) -> list[NodeSpec]:
        """Each node's validated config (defaults deep-merged with its overrides)."""
        entries = self.nodes or [
            {"node_id": f"node-{i}", "seed": i} for i in range(self.node_count or 3)
        ]
        specs = []
        for entry in entries:
            merged = _deep_merge(self.defaults, {k: v for k, v in entry.items() if k != "sampling"})
            if "node_id" not in entry:
                raise ValueError(f"a node entry has no node_id: {entry}")
            sampling = _deep_merge(self.sampling, entry.get("sampling") or {})
            specs.append(NodeSpec(node=NodeConfig.model_validate(merged), sampling=sampling))
        return specs

    def node_spec(self, node_id: str) -> NodeSpec:
        for spec in self.node_specs():
            if spec.node.node_id == node_id:
                return spec
        known = [s.node.node_id for s in self.node_specs()]
        raise ValueError(f"no node {node_id!r} in this swarm; it has {known}")

    def workdir_path(self) -> Path:
        return Path(self.workdir).expanduser().resolve()

    def ledger_config(self) -> LedgerConfig:
        data = {"max_staleness_s": 5.0, **self.ledger}
        data.setdefault("url", str(self.workdir_path() / "ledger"))
        return LedgerConfig.model_validate(data)

    def tracking_uri(self) -> str:
        return self.tracking.uri or f"sqlite:///{self.workdir_path() / 'mlflow.db'}"

    def artifact_location(self) -> str:
        return self.tracking.artifact_location or (self.workdir_path() / "mlartifacts").as_uri()


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`a.b.c=value` pairs onto a config dict; values are parsed as YAML (numbers, lists...)."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not key=value")
        parts = key.split(".")
        target: Any = out
        for part in parts[:-1]:
            target = _child(target, part, item)
        if isinstance(target, list):
            target[_index(target, parts[-1], item)] = yaml.safe_load(raw)
        else:
            target[parts[-1]] = yaml.safe_load(raw)
    return out


def _index(items: list[Any], part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ValueError(f"override {item!r}: {part!r} is not an index of a {len(items)}-list")
    return int(part)


def _child(target: Any, part: str, item: str) -> Any:
    """One step down a key path: a mapping's key (created if absent) or a list's index."""
    if isinstance(target, list):
        nxt = target[_index(target, part, item)]
    else:
        nxt = target.setdefault(part, {})
    if not isinstance(nxt, dict | list):
        raise ValueError(f"override {item!r}: {part!r} is not a mapping or a list")
    return nxt


def default_swarm_text() -> str:
    return resources.files("flows.swarms").joinpath(DEFAULT_SWARM).read_text()


def load_swarm(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    text: str | None = None,
) -> SwarmConfig:
    """The swarm file (or its text; default: the embedded CPU swarm) with overrides."""
    if text is None:
        text = Path(path).read_text() if path else default_swarm_text()
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path or DEFAULT_SWARM}: a swarm file is a mapping")
    return SwarmConfig.model_validate(apply_overrides(data, overrides or []))
