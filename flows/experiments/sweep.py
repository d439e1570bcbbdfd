"""A sharing sweep: one swarm run once per sharing configuration, nothing else varied.

    experiment: paper-cpu
    workdir: sapo-paper-cpu
    swarm: {rounds: 16, defaults: {...}, node_count: 3}   # a swarm file, minus its id
    configurations:
      - {local_groups: 4, external_groups: 0}               # the baseline (J = 0)
      - {local_groups: 2, external_groups: 2}
      - {local_groups: 1, external_groups: 3, sampling: {kind: variance_weighted}}

Each configuration becomes the swarm `<experiment>-<I>x<J>[-<policy>]` (a readable name,
nothing parses it) whose config carries `experiment: <experiment>`; each node records the
experiment, I, J and its policy in its manifest in the ledger (ledger/manifests.py), which
the report joins on. Each swarm has its own checkpoints under
`<workdir>/swarms/<swarm id>`, and all of them share one ledger and one MLflow store. A
configuration may set only I, J and the sampling policy, and I + J must be the same in all,
so seeds, tasks, models and compute per node are identical by construction.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from flows.config import (
    DEFAULT_POLICY,
    ConfigError,
    SwarmConfig,
    apply_overrides,
    node_entries,
    read_yaml_mapping,
    validate_swarm,
)
from flows.config_errors import describe_validation_error
from ledger.schema import check_id, sharing_label
from sapo_core.config import Strict
from sapo_core.config.node import MAX_GROUPS_PER_ROUND

FIXED_KEYS = ("swarm_id", "experiment", "workdir")  # set per configuration, never by the swarm
# Replicate `s` shifts every node's seed by s * SEED_STRIDE: other questions, other samples,
# the same in every configuration (paired); a readable seed, hashed into its question
# stream by sapo_core.tasks.stream_seed.
SEED_STRIDE = 1000
VARIED_NODE_KEYS = (
    "local_groups", "external_groups", "sampling", "questions_per_round", "local_selection",
    "completions_per_question", "off_policy",
)  # fmt: skip


class Configuration(Strict):
    """One sharing configuration: I local and J external groups per round, and a policy."""

    local_groups: int = Field(ge=0, le=MAX_GROUPS_PER_ROUND)
    external_groups: int = Field(ge=0, le=MAX_GROUPS_PER_ROUND)
    sampling: dict[str, Any] | None = Field(
        None, description="Sampling policy; default: the swarm's (the paper's uniform one)."
    )
    questions_per_round: int | None = Field(
        None, ge=1, le=1024, description="Own questions a round; default I + J (NodeConfig's)."
    )
    local_selection: Literal["drawn", "informative_first"] | None = Field(
        None, description="Which own groups a node trains on (NodeConfig's); default drawn."
    )

    completions_per_question: int | None = Field(
        None,
        ge=2,
        le=256,
        description="L, completions per question (GenerationConfig's); default the swarm's. "
        "The fair arm for a node alone: more rollouts per question (issue 58).",
    )
    off_policy: str | None = Field(
        None,
        description="grpo.off_policy.correction (OffPolicyConfig's); default the swarm's.",
    )

    def policy_kind(self, swarm: dict[str, Any]) -> str:
        sampling = self.sampling or swarm.get("sampling") or {}
        return str(sampling.get("kind", DEFAULT_POLICY))

    def suffix(self, swarm: dict[str, Any]) -> str:
        """`IxJ`, plus the policy when it is not the paper's and J > 0 (without peers no
        policy acts), the questions a round when they are not I + J, and the own groups'
        selection when it is not the default draw: e.g. `4x0`, `1x3-variance-weighted`,
        `4x0-q8-informative-first`; then the group size when set (`-L16`) and the
        off-policy correction when set (`-token-truncate`, `-none`)."""
        kind = self.policy_kind(swarm)
        shown = kind != DEFAULT_POLICY and self.external_groups > 0
        policy = "-" + kind.replace("_", "-") if shown else ""
        questions = f"-q{self.questions_per_round}" if self.questions_per_round else ""
        chosen = self.local_selection not in (None, "drawn")
        selection = "-" + str(self.local_selection).replace("_", "-") if chosen else ""
        size = f"-L{self.completions_per_question}" if self.completions_per_question else ""
        off = "-" + self.off_policy.replace("_", "-") if self.off_policy else ""
        return (
            f"{self.local_groups}x{self.external_groups}{policy}{questions}{selection}{size}{off}"
        )

    @property
    def label(self) -> str:
        return sharing_label(self.local_groups, self.external_groups)


class ExperimentConfig(Strict):
    """A sweep of sharing configurations over one swarm."""

    experiment: str = Field(description="An id (ledger.schema.check_id): it names the swarms.")
    workdir: str = Field("sapo-experiment", description="Ledger, MLflow store, checkpoints.")
    swarm: dict[str, Any] = Field(
        default_factory=dict, description="The swarm every configuration runs (no swarm_id)."
    )
    configurations: list[Configuration] = Field(min_length=1)
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="Replicates: each configuration runs once per seed s, every node's seed "
        f"shifted by s * {SEED_STRIDE} (paired across configurations); none: one run.",
    )
    baseline: str | None = Field(
        None, description="The configuration gains are measured against; default: the J = 0 one."
    )

    @field_validator("experiment")
    @classmethod
    def _an_id(cls, value: str) -> str:
        return check_id("experiment", value)

    @model_validator(mode="after")
    def _only_sharing_varies(self) -> Self:
        for key in FIXED_KEYS:
            if key in self.swarm:
                raise ValueError(f"swarm.{key} is set per configuration; leave it out")
        nodes = self.swarm.get("nodes") or []
        if not isinstance(nodes, list) or not all(isinstance(e, dict) for e in nodes):
            raise ValueError("swarm.nodes must be a list of node entries (mappings)")
        for entry in nodes:
            varied = [k for k in VARIED_NODE_KEYS if k in entry]
            if varied:
                raise ValueError(
                    f"node {entry.get('node_id')!r} sets {varied}: in a sweep only the "
                    "configurations vary them"
                )
        totals = {c.local_groups + c.external_groups for c in self.configurations}
        if len(totals) != 1:
            raise ValueError(
                f"I + J differs between configurations ({sorted(totals)}): each node must "
                "train on the same number of groups in every configuration"
            )
        ids = [self.swarm_id(c) for c in self.configurations]
        if len(set(ids)) != len(ids):
            raise ValueError(f"two configurations are the same: {ids}")
        if self.seeds is not None and (
            len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0
        ):
            raise ValueError(f"seeds must be distinct and >= 0: {self.seeds}")
        labels = [self.label(c) for c in self.configurations]
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline {self.baseline!r} is none of the configurations {labels}")
        for conf, seed in self.runs():
            self.swarm_config(conf, seed)  # every swarm must validate on its own
        return self

    def runs(self) -> list[tuple[Configuration, int | None]]:
        """Every (configuration, replicate seed) to run, seed by seed: a stopped experiment
        has whole replicates of every configuration rather than all seeds of a few."""
        if self.seeds is None:
            return [(c, None) for c in self.configurations]
        return [(c, s) for s in self.seeds for c in self.configurations]

    def label(self, conf: Configuration) -> str:
        """The configuration's name in reports: `I/J` and the policy when one acts."""
        return conf.suffix(self.swarm).replace("x", "/", 1)

    def baseline_label(self) -> str | None:
        if self.baseline is not None:
            return self.baseline
        plain = [self.label(c) for c in self.configurations if c.external_groups == 0]
        return plain[0] if plain else None

    def workdir_path(self) -> Path:
        return Path(self.workdir).expanduser().resolve()

    def report_path(self) -> Path:
        """Where the report goes by default: per experiment, so that sweeps sharing a working
        directory (and a ledger) keep their own."""
        return self.workdir_path() / "reports" / self.experiment

    def swarm_id(self, conf: Configuration, seed: int | None = None) -> str:
        replicate = "" if seed is None else f"-s{seed}"
        return f"{self.experiment}-{conf.suffix(self.swarm)}{replicate}"

    def swarm_data(self, conf: Configuration, seed: int | None = None) -> dict[str, Any]:
        """The swarm file of one run: shared ledger and MLflow, own checkpoints."""
        data = copy.deepcopy(self.swarm)
        root = self.workdir_path()
        swarm_id = self.swarm_id(conf, seed)
        data["swarm_id"] = swarm_id
        data["experiment"] = self.experiment
        data["workdir"] = str(root / "swarms" / swarm_id)
        # A finished run is compared, not continued: its training state (2/3 of every
        # node's checkpoint, and most of a sweep's disk) goes unless the file keeps it.
        data.setdefault("checkpoint_keep", "final-model")
        data.setdefault("ledger", {}).setdefault("url", str(root / "ledger"))
        tracking = data.setdefault("tracking", {})
        tracking.setdefault("uri", f"sqlite:///{root / 'mlflow.db'}")
        tracking.setdefault("experiment", self.experiment)
        tracking.setdefault("artifact_location", (root / "mlartifacts").as_uri())
        defaults = data.setdefault("defaults", {})
        defaults["local_groups"] = conf.local_groups
        defaults["external_groups"] = conf.external_groups
        if conf.questions_per_round is not None:
            defaults["questions_per_round"] = conf.questions_per_round
        if conf.local_selection is not None:
            defaults["local_selection"] = conf.local_selection
        if conf.sampling is not None:
            data["sampling"] = copy.deepcopy(conf.sampling)
        if conf.completions_per_question is not None:
            generation = defaults.setdefault("generation", {})
            generation["completions_per_question"] = conf.completions_per_question
        if conf.off_policy is not None:
            grpo = defaults.setdefault("grpo", {})
            grpo.setdefault("off_policy", {})["correction"] = conf.off_policy
        if seed:
            data["nodes"] = self._shifted_nodes(data, seed)
        return data

    @staticmethod
    def _shifted_nodes(data: dict[str, Any], seed: int) -> list[dict[str, Any]]:
        """The swarm's node entries with every seed moved by seed * SEED_STRIDE."""
        base = data.get("defaults", {}).get("seed", 0)
        return [
            {**n, "seed": int(n.get("seed", base)) + seed * SEED_STRIDE} for n in node_entries(data)
        ]

    def swarm_config(self, conf: Configuration, seed: int | None = None) -> SwarmConfig:
        where = f"configuration {conf.label}" + ("" if seed is None else f", seed {seed}")
        return validate_swarm(self.swarm_data(conf, seed), where)

    def replicates(self) -> dict[str, tuple[str, int]]:
        """swarm_id -> (configuration label, seed): how the statistics pair the runs."""
        return {self.swarm_id(c, s): (self.label(c), 0 if s is None else s) for c, s in self.runs()}

    def own_generation(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """Configuration label -> each node's own questions a round and completions a
        question: configurations that differ here draw other own groups at round 0 by design
        (the round-0 pairing check), as a control making more questions or larger groups."""
        return {
            self.label(c): tuple(
                (spec.node.questions, spec.node.generation.completions_per_question)
                for spec in self.swarm_config(c).nodes
            )
            for c in self.configurations
        }

    def ledger_url(self) -> str:
        return self.swarm_config(self.configurations[0]).ledger.url

    def tracking_uri(self) -> str:
        return self.swarm_config(self.configurations[0]).tracking_uri()


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """An experiment file with `--set key=value` overrides (e.g. swarm.rounds=2)."""
    keys = ExperimentConfig.model_fields
    for item in overrides or []:
        top = item.partition("=")[0].split(".")[0]
        if (
            "=" in item
            and top in {*SwarmConfig.model_fields, "defaults", "sampling"}
            and top not in keys
        ):
            # a swarm file's form: the experiment holds its swarm under swarm:
            raise ConfigError(
                f"--set {item}: {top!r} is a key of the swarm, which an experiment file "
                f"holds under swarm:; --set swarm.{item}"
            )
    data = apply_overrides(read_yaml_mapping(path, what="experiment file"), overrides or [])
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, str(path))) from exc
