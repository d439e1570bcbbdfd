"""Does one node learn on CPU? Reward per round, seconds per round, peak memory.

One node, J = 0 (plain GRPO fine-tuning), the bundled SmolLM2-135M-Instruct, an easy task
mix where the untrained model already earns some reward (otherwise GRPO has no signal: a
group whose completions all score 0 has zero advantage). Questions are fresh every round,
so the reward of round r is the policy's score on unseen questions.

    python benchmarks/learning.py --rounds 30
    python benchmarks/learning.py --rounds 3 --completions 4 --max-new-tokens 128  # peers' workload
    python benchmarks/learning.py --rounds 8 --adapter-rank 16 --lr 1e-4  # a LoRA adapter
    python benchmarks/learning.py --rounds 8 --optimizer adamw_8bit  # 8-bit Adam moments
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows.env import apply_offline_defaults

EASY_MIX = {
    # two one-digit terms: the bundled model answers ~25% of these right unaided
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}


def node_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from sapo_core.config import NodeConfig

    return NodeConfig.model_validate(
        {
            "node_id": "bench",
            "local_groups": args.questions,
            "external_groups": 0,
            "seed": args.seed,
            "tasks": {"specs": [{"name": n, "config": c} for n, c in EASY_MIX.items()]},
            "prompt": {"system_prompt": args.system_prompt, "prefill": args.prefill},
            "reward": {"extraction": args.extraction, "format_weight": args.format_weight},
            "generation": {
                "completions_per_question": args.completions,
                "max_new_tokens": args.max_new_tokens,
                "temperature": args.temperature,
                "batch_size": args.questions * args.completions,
            },
            "grpo": {
                "learning_rate": args.lr,
                "iterations": args.iterations,
                "micro_batch_size": args.micro_batch,
                "micro_batch_tokens": args.micro_batch_tokens,
                "loss_type": args.loss_type,
                "optimizer": args.optimizer,
                "drop_zero_variance": not args.keep_zero_variance,
                "adapter": adapter_section(args.adapter_rank, args.base_precision),
            },
        }
    )


def adapter_section(rank: int, base_precision: str = "auto") -> dict[str, object]:
    """No adapter at rank 0; else LoRA of that rank with alpha = 2 rank (the scale alpha / r
    of the default, 32 / 16, at every rank), its frozen base in ``base_precision``."""
    if rank == 0:
        return {"kind": "none"}
    return {"kind": "lora", "rank": rank, "alpha": 2 * rank, "base_precision": base_precision}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def parser(doc: str | None = __doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--completions", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--iterations", type=int, default=1)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--micro-batch-tokens", type=int, default=None)
    p.add_argument("--loss-type", default="grpo")
    p.add_argument(
        "--optimizer",
        choices=["auto", "adamw", "adamw_8bit"],
        default="auto",
        help="adamw_8bit: bitsandbytes' 8-bit moments (the learning-parity check of issue 44)",
    )
    p.add_argument(
        "--keep-zero-variance",
        action="store_true",
        help="train on all-equal groups too (as TRL does), for a like-for-like speed test",
    )
    p.add_argument("--extraction", default="last_number")
    p.add_argument("--format-weight", type=float, default=0.0)
    p.add_argument("--prefill", default="")
    p.add_argument("--system-prompt", default="Answer with the final number.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--adapter-rank", type=int, default=0, help="train a LoRA adapter of this rank (0: none)"
    )
    p.add_argument(
        "--base-precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="an adapter's frozen base: auto is bf16 where the CPU computes it natively",
    )
    p.add_argument("--json", type=Path, help="also write the rounds here")
    return p


def run_rounds(learner, rounds: int) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    """Generate and train ``rounds`` rounds, printing a line each; the rows."""
    print("round  reward  gen_s  update_s  round_s  gen_tok  zero_var  clip   peak_GB")
    rows = []
    for r in range(rounds):
        t0 = time.perf_counter()
        generated = learner.generate(r)
        report = learner.train_round(r, generated)
        seconds = time.perf_counter() - t0
        row = {
            "round": r,
            "reward": report.training_reward,
            "generation_s": generated.seconds,
            "update_s": report.update_s,
            "round_s": seconds,
            "generated_tokens": generated.tokens,
            "zero_variance": report.zero_variance_fraction,
            "clip_fraction": report.update.get("clip_fraction", 0.0),
            "peak_rss_gb": peak_rss_gb(),
        }
        rows.append(row)
        print(
            f"{r:5d}  {row['reward']:.3f}  {row['generation_s']:5.1f}  {row['update_s']:8.1f}  "
            f"{seconds:7.1f}  {row['generated_tokens']:7d}  {row['zero_variance']:8.2f}  "
            f"{row['clip_fraction']:.3f}  {row['peak_rss_gb']:7.2f}",
            flush=True,
        )
    return rows


def main() -> None:
    args = parser().parse_args()
    apply_offline_defaults()

    import torch

    from sapo_core.learner import Learner

    torch.set_num_threads(torch.get_num_threads())
    started = time.perf_counter()
    learner = Learner(node_config(args))
    print(f"model loaded in {time.perf_counter() - started:.1f}s; config: {vars(args)}")
    rows = run_rounds(learner, args.rounds)
    rewards = [r["reward"] for r in rows]
    k = max(1, len(rewards) // 3)
    first, last = statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])
    noise = statistics.stdev(rewards[:k]) if k > 1 else float("nan")
    print(
        f"\nfirst {k} rounds mean {first:.3f}, last {k} rounds mean {last:.3f}, "
        f"rise {last - first:+.3f}; round-to-round std over the first {k}: {noise:.3f}"
    )
    print(
        f"per round: generation {statistics.fmean(r['generation_s'] for r in rows):.1f}s, "
        f"update {statistics.fmean(r['update_s'] for r in rows):.1f}s, "
        f"total {statistics.fmean(r['round_s'] for r in rows):.1f}s; "
        f"peak memory {max(r['peak_rss_gb'] for r in rows):.2f} GB"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
