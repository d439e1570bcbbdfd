"""Full fine-tuning against LoRA adapters, side by side in one run (issue 31).

Each variant runs in a fresh process (its own peak RSS), one after another, on the learning
benchmark's node (benchmarks/learning.py: the bundled SmolLM2-135M-Instruct, J = 0, the
same seed, so the same questions every round). Per variant: reward per round, seconds per
round (generation and update), peak RSS, then the bytes of a node checkpoint (what a
resume needs: weights or adapter, Adam state, tokenizer) and of the model MLflow logs (the
whole model, or the adapter naming its base).

    python benchmarks/adapters.py --rounds 8
    python benchmarks/adapters.py --rounds 8 --variants full:1e-5,lora-r16:1e-4 --json out.json

A variant is `full` or `lora-rN` (its base in bf16 where the CPU computes bf16 natively, as a
node's `base_precision: auto` does) or `lora-rN-fp32` / `lora-rN-bf16` (the base's format
forced), with its learning rate after the colon (LoRA is usually
trained at about ten times full fine-tuning's rate: Schulman et al., "LoRA Without Regret",
Thinking Machines 2025). Time it only on an idle machine: the load is printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import learning  # benchmarks/learning.py, beside this file

from flows.env import apply_offline_defaults

DEFAULT_VARIANTS = "full:1e-5,lora-r8-fp32:1e-4,lora-r8:1e-4,lora-r16:1e-4"


def parse_variant(variant: str) -> tuple[int, str]:
    """(rank, base precision): (0, fp32) for full fine-tuning, (N, auto) for `lora-rN`, and
    (N, fp32 or bf16) for `lora-rN-fp32` / `lora-rN-bf16`."""
    if variant == "full":
        return 0, "fp32"
    rank, _, precision = variant.removeprefix("lora-r").partition("-")
    if variant.startswith("lora-r") and rank.isdigit() and precision in ("", "fp32", "bf16"):
        return int(rank), precision or "auto"
    raise SystemExit(f"unknown variant {variant!r}: full, lora-rN or lora-rN-fp32/-bf16")


def parse_variants(text: str) -> list[tuple[str, str]]:
    """``full:1e-5,lora-r8:1e-4`` as (variant, learning rate) pairs, all checked before any
    runs: a typo is an error now, not after the first variant's minutes."""
    pairs = []
    for item in text.split(","):
        variant, _, lr = item.partition(":")
        parse_variant(variant)
        try:
            float(lr)
        except ValueError:
            wanted = "a variant and its learning rate, e.g. lora-r8:1e-4"
            raise SystemExit(f"{item!r}: {wanted}") from None
        pairs.append((variant, lr))
    return pairs


def measure_one(args) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One variant in this process: its rounds, then a checkpoint and a logged model."""
    import torch

    from flows.node import checkpoint
    from flows.swarm.launcher import disk_usage  # what `sapo swarm` reports at the end
    from flows.tracking import open_tracker
    from sapo_core.learner import Learner
    from sapo_core.policy.adapter import trainable_parameters

    torch.set_num_threads(torch.get_num_threads())
    started = time.perf_counter()
    learner = Learner(learning.node_config(args))
    loaded_s = time.perf_counter() - started
    trainable, total = trainable_parameters(learner.policy.model)
    base_dtype = str(learner.policy.model.get_input_embeddings().weight.dtype).removeprefix(
        "torch."
    )
    rows = learning.run_rounds(learner, args.rounds)
    with tempfile.TemporaryDirectory(prefix="sapo-adapters-") as tmp:
        work = Path(tmp)
        saved = checkpoint.write(checkpoint.capture(work, "bench", learner, args.rounds))
        checkpoint_bytes = sum(disk_usage(saved.path).values())
        tracker = open_tracker(
            f"sqlite:///{work / 'mlflow.db'}", "adapters", (work / "artifacts").as_uri()
        )
        run_id = tracker.run("bench", {"sapo.node_id": "bench"})
        assert run_id is not None
        logged = tracker.log_model(run_id, learner.policy.model, learner.policy.tokenizer, work)
        if logged is None:
            raise SystemExit("the model could not be logged")
        logged_bytes = sum(disk_usage(work / "artifacts").values())
    return {
        "rows": rows,
        "load_s": loaded_s,
        "trainable_params": trainable,
        "base_dtype": base_dtype,
        "total_params": total,
        "checkpoint_bytes": checkpoint_bytes,
        "logged_model_bytes": logged_bytes,
        "peak_rss_gb": learning.peak_rss_gb(),
    }


def run_variant(variant: str, lr: str, args) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One variant in a child process; its measurements."""
    rank, base_precision = parse_variant(variant)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [
            sys.executable, __file__, "--one", "--adapter-rank", str(rank),
            "--base-precision", base_precision,
            "--lr", lr, "--rounds", str(args.rounds), "--seed", str(args.seed),
            "--questions", str(args.questions), "--completions", str(args.completions),
            "--max-new-tokens", str(args.max_new_tokens), "--json", out.name,
        ]  # fmt: skip
        print(f"\n== {variant} (lr {lr})", flush=True)
        subprocess.run(command, check=True)
        return dict(json.loads(Path(out.name).read_text()), variant=variant, lr=float(lr))


def mean(rows: list[dict[str, float]], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def table(results: list[dict]) -> str:  # type: ignore[type-arg]
    head = (
        "| variant | base | lr | trainable params | s/round (gen + update) | peak RSS GB | "
        "checkpoint MB | logged model MB | mean reward, rounds 0-1 | mean reward, last 2 |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in results:
        rows = r["rows"]
        lines.append(
            f"| {r['variant']} | {r['base_dtype']} | {r['lr']:g} | "
            f"{r['trainable_params'] / 1e6:.1f} M | "
            f"{mean(rows, 'round_s'):.1f} ({mean(rows, 'generation_s'):.1f} + "
            f"{mean(rows, 'update_s'):.1f}) | {r['peak_rss_gb']:.2f} | "
            f"{r['checkpoint_bytes'] / 1e6:.1f} | {r['logged_model_bytes'] / 1e6:.1f} | "
            f"{mean(rows[:2], 'reward'):.3f} | {mean(rows[-2:], 'reward'):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = learning.parser(__doc__)
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="variant:lr, comma-separated")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a variant's child
    p.set_defaults(rounds=8)
    args = p.parse_args()
    apply_offline_defaults()
    if args.one:
        args.json.write_text(json.dumps(measure_one(args)))
        return
    variants = parse_variants(args.variants)
    print(f"load average before: {os.getloadavg()}; {os.cpu_count()} cores")
    results = [run_variant(variant, lr, args) for variant, lr in variants]
    print(f"\nload average after: {os.getloadavg()}")
    print("\nreward per round:")
    for r in results:
        print(f"  {r['variant']:>9}: " + " ".join(f"{row['reward']:.3f}" for row in r["rows"]))
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
