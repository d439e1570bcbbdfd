"""One node's SAPO round with `sapo_core` alone: the algorithm on one page.

    python examples/one_round.py --questions 4 --completions 4 --max-new-tokens 64

A round, top to bottom (the full node is `sapo_core.learner.Learner`; `flows/` runs it with
the rollout ledger, Prefect and MLflow around it, none of which is needed here):

1. draw B questions from the node's reasoning-gym task mix;
2. generate G completions of each with the policy: a question's G completions are a group;
3. verify every completion with the node's own verifier (reasoning-gym's: 1 if right);
4. (swarm) peers' groups would join the training set here, re-scored by the same verifier;
5. group-normalised advantages: (reward - group mean) / group std;
6. token log-probs of the completions under the current policy, with gradients (plain path);
7. the clipped GRPO loss against the behaviour log-probs recorded while generating;
8. one optimizer step; then the loss again on the same batch, which should have dropped.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import time
from typing import Any

# Offline and quiet by default, like the project's entry points (flows/env.py): a hub id
# loads from the local cache only (HF_HUB_OFFLINE=0 to download); set before transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

from sapo_core.config import BUNDLED_MODEL, NodeConfig
from sapo_core.grpo.advantages import dense_group_ids, group_advantages
from sapo_core.grpo.logprobs import plain_logprobs
from sapo_core.grpo.loss import policy_loss
from sapo_core.grpo.optimizer import make_optimizer
from sapo_core.grpo.segments import Segment, padded
from sapo_core.policy.hf_backend import TransformersBackend
from sapo_core.policy.loading import load_policy
from sapo_core.prompts import prompt_ids
from sapo_core.rewards import verify_answer
from sapo_core.tasks import TaskSource

# One worked example shows the <answer> format: without it a 135M model rarely writes the
# tag, and the strict verifier (the paper's) pays only for tagged answers.
WORKED_EXAMPLE = {
    "question": "What is 12 + 30?",
    "completion": "12 + 30 = 42.\n<answer>42</answer>",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=BUNDLED_MODEL, help="HF id, local folder or the bundle")
    p.add_argument("--tasks", default="", help="comma-separated reasoning-gym tasks (paper's 9)")
    p.add_argument("--questions", type=int, default=4, help="B: questions (groups) this round")
    p.add_argument("--completions", type=int, default=4, help="G: completions per question")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5, help="Adam step size (Gensyn's default)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # 0. Configuration: what a swarm node reads from its YAML file, validated the same way.
    tasks = {"specs": [{"name": t} for t in args.tasks.split(",")]} if args.tasks else {}
    cfg = NodeConfig.model_validate(
        {
            "model": args.model,
            "seed": args.seed,
            "local_groups": args.questions,  # I: own groups trained on (J = 0: see step 4)
            "tasks": tasks,  # {}: the paper's nine reasoning-gym tasks, drawn uniformly
            "prompt": {"examples": [WORKED_EXAMPLE]},
            "generation": {
                "completions_per_question": args.completions,
                "max_new_tokens": args.max_new_tokens,
            },
            "grpo": {"learning_rate": args.lr},  # the rest: the paper's (clip 0.2 / 0.28, no KL)
        }
    )
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.model)  # fp32 on the CPU: generation's log-probs = training's
    optimizer = make_optimizer(policy.model, cfg.grpo)
    pad_id, temperature = int(policy.tokenizer.pad_token_id), cfg.generation.temperature

    # 1. Questions: deterministic in (seed, round); anyone can regenerate a question and its
    # ground truth from four fields (task, config, seed, index).
    questions = TaskSource(cfg.tasks, cfg.seed).draw(round_=0, count=cfg.questions)
    print(f"[1] {len(questions)} questions: {', '.join(q.task for q in questions)}")

    # 2. Generate G completions per question. The backend records each sampled token's
    # log-prob: the behaviour policy's, the denominator of the GRPO ratio in step 7.
    started = time.perf_counter()
    prompts = [prompt_ids(policy.tokenizer, q.question, cfg.prompt) for q in questions]
    groups = TransformersBackend(policy).generate(prompts, cfg.generation, seed=cfg.seed)
    tokens = sum(len(c.token_ids) for group in groups for c in group)
    took = time.perf_counter() - started
    print(f"[2] {sum(map(len, groups))} completions, {tokens} tokens in {took:.1f} s")

    # 3. Verify with this node's own verifier: the ground truth is re-derived from the
    # question's task fields, never taken from whoever wrote the row.
    rewards: list[list[float]] = []
    for q, group in zip(questions, groups, strict=True):
        verdicts = [verify_answer(q, cfg.prompt.prefill + c.text, cfg.reward) for c in group]
        assert all(v.reward is not None for v in verdicts), "own questions always verify"
        rewards.append([v.reward or 0.0 for v in verdicts])
    flat = [r for group_rewards in rewards for r in group_rewards]
    mean_reward = sum(flat) / len(flat)
    means = [round(sum(r) / len(r), 3) for r in rewards]
    print(f"[3] mean reward {mean_reward:.3f}; per group {means}")

    # 4. SAPO's swarm part plugs in here. In a swarm, peers' groups (text: question fields
    # and completions, read from the ledger) would be appended to the training set here and
    # re-scored by this node's verifier (`rewards.score_groups` with `ConfigBounds`), their
    # text re-encoded with this node's tokenizer (`prompts.text_ids`). Their behaviour
    # log-probs are unknown, so step 7 would use the current policy's, detached (ratio 1).
    # J = 0, as here, is plain single-node GRPO: the paper's baseline.

    # 5. Advantages, normalised within each group (groups found by id, never by reshaping).
    ids = dense_group_ids([f"q{k}" for k, group in enumerate(groups) for _ in group])
    advantages = group_advantages(torch.tensor(flat), ids, cfg.grpo.scale_rewards).tolist()
    per_group = [advantages[k * len(g) : (k + 1) * len(g)] for k, g in enumerate(groups)]
    # A group whose completions all got the same reward has zero advantages: no gradient,
    # it only dilutes the mean (the paper drops them; GRPOConfig.drop_zero_variance).
    kept = [k for k, r in enumerate(rewards) if len(set(r)) > 1]
    segments = [
        Segment(
            prompts[k], [list(c.token_ids) for c in g], per_group[k], [list(c.logprobs) for c in g]
        )
        for k, g in enumerate(groups)
        if k in kept
    ]
    print(f"[5] {len(kept)} of {len(groups)} groups carry a learning signal")
    figures = {"completions": len(flat), "rewards": flat, "advantages": per_group, "tokens": tokens}
    figures |= {"mean_reward": mean_reward, "groups_trained": len(kept), "loss": 0.0}
    if not kept:
        print("    nothing to learn this round (in a swarm, peers' groups might have it)")
        return figures | {"loss_after": 0.0, "trained_tokens": 0}

    # 6. Log-probs [B, T] of each completion token under the current policy, with gradients:
    # one ordinary forward over prompt + completion (`completion_logprobs` picks a faster
    # path, equal to this one, where the model family allows it).
    policy.model.train()
    logprobs, mask = plain_logprobs(policy.model, segments, temperature, pad_id)
    behaviour = [list(c.logprobs) for k in kept for c in groups[k]]  # recorded in step 2
    old = padded(behaviour, logprobs.size(1), 0.0, torch.float32)  # [B, T]
    adv = torch.tensor([a for k in kept for a in per_group[k]])  # [B]

    # 7. Clipped GRPO loss: -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A),
    # ratio = exp(logprob - behaviour logprob); asymmetric clip and no KL, as in the paper.
    grpo = cfg.grpo
    clipped = functools.partial(
        policy_loss,
        old_logprobs=old,
        advantages=adv,
        mask=mask,
        loss_type=grpo.loss_type,
        eps_low=grpo.eps_low,
        eps_high=grpo.eps_high,
        max_completion_length=args.max_new_tokens,
    )
    loss, metrics = clipped(logprobs)  # on-policy (ratio 1) it is 0 here; its gradient is not
    print(f"[7] loss {metrics['loss']:+.5f} over {int(mask.sum())} tokens", end=", ")
    print(f"ratio {metrics['ratio_mean']:.4f}, clipped {metrics['clip_fraction']:.1%}")

    # 8. One step. Then the same loss under the updated policy: a small step along the
    # gradient lowers it (rewarded completions became likelier, unrewarded ones less so).
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(policy.model.parameters(), grpo.max_grad_norm or math.inf)
    optimizer.step()
    with torch.no_grad():
        after, _ = clipped(plain_logprobs(policy.model, segments, temperature, pad_id)[0])
    print(f"[8] step: grad norm {norm.item():.4f}; same loss after it {after.item():+.5f}")
    figures |= {"loss": metrics["loss"], "loss_after": after.item()}
    return figures | {"trained_tokens": int(mask.sum())}


if __name__ == "__main__":
    main()
