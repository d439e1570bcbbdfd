"""How much learning signal does an untrained node get? Measure before running an experiment.

GRPO learns only from informative groups (completions of one question that earned different
rewards); a group whose completions all score 0 has zero advantage. SAPO's sharing can only
help if someone, somewhere, has informative groups to share. This probe generates a few
rounds with each node's *initial* policy, exactly as the experiment file configures it
(tasks, prompt, examples, extraction, L, max new tokens), and prints per task: how many
completions wrote an answer tag, the mean reward, and the share of informative and of
medium-difficulty (25-75% correct) groups. It also prints seconds per node-round, to size
the experiment.

    python benchmarks/learning_signal.py -c examples/aha-cpu.yaml --rounds 2
    python benchmarks/learning_signal.py -c examples/aha-cpu.yaml \
        --set swarm.defaults.generation.max_new_tokens=96
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults


def node_configs(path: str, overrides: list[str]) -> list[Any]:
    """The distinct node configs of an experiment file (its first configuration) or swarm."""
    from flows.config import load_swarm, read_yaml_mapping
    from flows.experiments.sweep import load_experiment

    if "configurations" in read_yaml_mapping(path, what="file"):
        exp = load_experiment(path, overrides)
        swarm = exp.swarm_config(exp.configurations[0])
    else:
        swarm = load_swarm(path, overrides)
    return [spec.node for spec in swarm.nodes]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("-c", "--config", required=True, help="experiment or swarm file")
    p.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    p.add_argument("--rounds", type=int, default=2, help="rounds probed per node")
    p.add_argument("--nodes", type=int, default=None, help="probe only the first N nodes")
    p.add_argument("--json", type=Path, help="also write the per-task table here")
    args = p.parse_args()
    apply_offline_defaults()

    from sapo_core.learner import Learner
    from sapo_core.policy.loading import load_policy
    from sapo_core.prompts import tagged_answer

    configs = node_configs(args.config, args.overrides)[: args.nodes]
    policy = load_policy(configs[0].model)
    per_task: dict[str, dict[str, int | float]] = defaultdict(lambda: defaultdict(float))
    seconds, tokens = [], 0
    for config in configs:
        learner = Learner(config, policy)
        for round_ in range(args.rounds):
            generated = learner.generate(round_)
            seconds.append(generated.seconds)
            tokens += generated.tokens
            for group in generated.groups:
                rewards = [r.reward or 0.0 for r in group.rollouts]
                row = per_task[group.question.task]
                row["groups"] += 1
                row["completions"] += len(rewards)
                tagged = [tagged_answer(r.completion) is not None for r in group.rollouts]
                row["tagged"] += sum(tagged)
                row["reward_sum"] += sum(rewards)
                row["informative"] += len(set(rewards)) > 1
                row["medium"] += 0.25 <= statistics.fmean(rewards) <= 0.75
            print(
                f"{config.node_id} round {round_}: {generated.seconds:.1f}s, "
                f"{generated.tokens} tokens, reward {generated.own_reward:.3f}",
                flush=True,
            )
    table = []
    for task, row in [*sorted(per_task.items()), ("all", _total(per_task))]:
        table.append(
            {
                "task": task,
                "groups": int(row["groups"]),
                "tagged": row["tagged"] / row["completions"],
                "reward_mean": row["reward_sum"] / row["completions"],
                "informative": row["informative"] / row["groups"],
                "medium": row["medium"] / row["groups"],
            }
        )
    print("\ntask                      groups  tagged  reward  informative  medium(25-75%)")
    for t in table:
        print(
            f"{t['task']:<25} {t['groups']:6d}  {t['tagged']:6.1%}  {t['reward_mean']:6.3f}  "
            f"{t['informative']:11.1%}  {t['medium']:14.1%}"
        )
    print(
        f"\ngeneration: {statistics.fmean(seconds):.1f}s per node-round (one process alone), "
        f"{tokens / len(seconds):.0f} tokens per node-round"
    )
    if args.json:
        args.json.write_text(json.dumps(table, indent=1))


def _total(per_task: dict[str, dict[str, int | float]]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for row in per_task.values():
        for key, value in row.items():
            total[key] += value
    return total


if __name__ == "__main__":
    main()
