"""One node's SAPO round with `sapo_core` alone: the round a swarm node runs, on one page.

    python examples/one_round.py --questions 2 --completions 4

On the bundled SmolLM2-135M it takes about a minute on 2 cores. By default the questions
are the embedded CPU swarm's (one-digit sums, the last number in a completion its answer),
which the small model gets right some of the time: a group whose answers all score alike
carries no gradient, so until one does the node draws new questions (as its next round
would), and every step below shows.

The same two calls as a node in a swarm (flows/node/steps.py), `Learner.generate` and
`Learner.train_round`, without the ledger, Prefect or MLflow around them; where to read
each step's code is in brackets:

1. draw B questions from the node's reasoning-gym task mix      [sapo_core/tasks.py]
2. generate G completions of each: a question's G are a group   [sapo_core/policy/]
3. verify each with the node's own verifier (1 if right)         [sapo_core/rewards.py]
4. the training set: I own groups + J peers' groups, each peer's re-verified here; groups
   whose completions all scored alike carry no gradient and are left out
                                                                 [sapo_core/assembly.py]
5. group-normalised advantages: (reward - group mean) / group std
                                                                 [sapo_core/grpo/advantages.py]
6. the clipped GRPO loss over the completions' token log-probs, one optimizer step
                                                                 [sapo_core/grpo/]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

# Offline and quiet by default, like the project's entry points (flows/env.py): a hub id
# loads from the local cache only (HF_HUB_OFFLINE=0 to download); set before transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from sapo_core.config import BUNDLED_MODEL, NodeConfig
from sapo_core.learner import Learner
from sapo_core.rollouts import Group

# One worked example shows the <answer> format: without it a 135M model rarely writes the
# tag, and the strict verifier (the paper's) pays only for tagged answers.
WORKED_EXAMPLE = {
    "question": "What is 12 + 30?",
    "completion": "12 + 30 = 42.\n<answer>42</answer>",
}


EASY = {
    "tasks": {"specs": [{"name": "chain_sum", "config": {"min_terms": 2, "max_terms": 2,
                                                        "min_digits": 1, "max_digits": 1}}]},
    "reward": {"extraction": "last_number"},
}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=BUNDLED_MODEL, help="HF id, local folder or the bundle")
    p.add_argument(
        "--tasks",
        default="",
        help="comma-separated reasoning-gym tasks, answered in <answer> tags (default: the "
        "embedded CPU swarm's one-digit sums)",
    )
    p.add_argument("--questions", type=int, default=4, help="B: questions (groups) this round")
    p.add_argument("--completions", type=int, default=4, help="G: completions per question")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5, help="Adam step size (Gensyn's default)")
    p.add_argument("--draws", type=int, default=4, help="rounds of questions to try for a signal")
    return p.parse_args(argv)


def node_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a swarm node reads from its YAML file (validated by the same `NodeConfig`)."""
    return {
        "model": args.model,
        "seed": args.seed,
        "local_groups": args.questions,  # I: own groups trained on
        "external_groups": 0,  # J: peers' groups (none without a swarm: plain GRPO)
        **(
            {"tasks": {"specs": [{"name": t} for t in args.tasks.split(",")]}}
            if args.tasks
            else EASY  # what the embedded CPU swarm asks (flows/swarms/cpu.yaml)
        ),
        "prompt": {"examples": [WORKED_EXAMPLE]},
        "generation": {
            "completions_per_question": args.completions,
            "max_new_tokens": args.max_new_tokens,
        },
        "grpo": {"learning_rate": args.lr},  # the rest: the paper's (clip 0.2 / 0.28, no KL)
    }


def main(argv: list[str] | None = None, peers: list[Group] | None = None) -> dict[str, Any]:
    """The round; ``peers``: groups other nodes published (a swarm's ledger draws them)."""
    args = parse_args(argv)
    learner = Learner(NodeConfig.model_validate(node_settings(args)))

    for round_ in range(args.draws):
        # 1-3. Questions, G completions each, and this node's verdict on every completion:
        # its ground truth re-derived from the question's task fields, never taken from a row.
        generated = learner.generate(round_)
        rewards = [[r.reward for r in g.rollouts] for g in generated.groups]
        tasks = [g.question.task for g in generated.groups]
        print(f"[1] round {round_}: {len(generated.groups)} questions: {tasks}")
        print(f"[2] {sum(map(len, rewards))} completions, {generated.tokens} tokens")
        print(f"[3] own reward {generated.own_reward:.3f}; per group {rewards}")

        # 4-6. The learner's round, the call a swarm node makes once it has published its
        # groups and drawn its peers': peers' groups are plain text, re-encoded with this
        # node's tokenizer and re-scored by its verifier (a lying peer's rows are flagged,
        # never trained on, and counted against it); the training set; the GRPO step.
        report = learner.train_round(round_, generated, peers or [])
        chosen = report.chosen
        assert chosen is not None
        print(f"[4] {len(chosen.trained)} of {len(chosen.selected)} groups carry a signal")
        if chosen.trained:
            break
        print("    none: no step; new questions, as the node's next round would draw")

    # 5. Advantages within each group: what the update weighed each completion by.
    segments, _ = learner.encode(chosen.trained)
    advantages = [[round(a, 3) for a in seg.advantages] for seg in segments]
    print(f"[5] advantages {advantages}")

    # 6. The GRPO step: token log-probs under the current policy, the clipped loss against
    # the behaviour log-probs recorded while generating, gradients, one optimizer step.
    update = report.update
    if update:
        print(
            f"[6] loss {update['loss']:+.5f}, grad norm {update['grad_norm']:.4f}, "
            f"clipped {update['clip_fraction']:.1%}, {update['update_passes']:.0f} pass(es), "
            f"{report.update_s:.1f} s"
        )
    else:
        print("[6] nothing to learn this round (in a swarm, peers' groups might have it)")
    return {
        "learner": learner,
        "rewards": rewards,
        "chosen": chosen,
        "advantages": [list(seg.advantages) for seg in segments],
        "report": report,
    }


if __name__ == "__main__":
    main()
