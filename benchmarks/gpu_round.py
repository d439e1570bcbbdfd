"""The paper's node on a GPU: seconds per round (generation, update) and peak GPU memory.

A randomly initialised model of the Qwen2.5-0.5B architecture (no weights can be fetched on
the machines this runs on; a random model never stops early, so every completion runs to
the token limit: the worst case), the bundled tokenizer, 8 questions x 8 completions x 512
new tokens per round, J = 0, the node's default compute placement (CUDA, bf16 autocast
where the device supports it, fp32 weights and optimizer state). The first round warms up
and is left out of the means.

    python benchmarks/gpu_round.py --rounds 3
    python benchmarks/gpu_round.py --rounds 2 --layers 2 --max-new-tokens 8   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Qwen2.5-0.5B's published architecture (its config.json).
QWEN25_05B: dict[str, Any] = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "use_sliding_window": False,
}
# Qwen2.5-1.5B's (its config.json); the rest as 0.5B's.
QWEN25_15B: dict[str, Any] = {
    **QWEN25_05B,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
}
# A Qwen2.5 of Qwen's vocabulary and a tiny body: runs the GPU benchmarks end to end on a CPU.
TINY_QWEN: dict[str, Any] = {
    **QWEN25_05B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
ARCHS = {"qwen2.5-0.5b": QWEN25_05B, "qwen2.5-1.5b": QWEN25_15B, "tiny-qwen": TINY_QWEN}


def build_model(folder: Path, layers: int | None, shape: dict[str, Any] | None = None) -> Path:
    """A random model of Qwen2.5 ``shape`` (default 0.5B's) with the bundled tokenizer,
    saved to folder."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sapo_core.config import BUNDLED_MODEL
    from sapo_core.policy.loading import load_tokenizer

    torch.manual_seed(0)
    shape = {**(shape or QWEN25_05B), **({"num_hidden_layers": layers} if layers else {})}
    tokenizer = load_tokenizer(BUNDLED_MODEL)
    config = Qwen2Config(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--completions", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--layers", type=int, help="fewer layers than the real 24 (smoke runs)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    import torch

    from sapo_core.config import NodeConfig
    from sapo_core.learner import Learner

    folder = build_model(Path(tempfile.mkdtemp(prefix="qwen25-05b-random-")), args.layers)
    config = NodeConfig.model_validate(
        {
            "node_id": "gpu-bench",
            "model": str(folder),
            "local_groups": args.questions,
            "tasks": {"specs": [{"name": "chain_sum", "config": {}}]},
            "generation": {
                "completions_per_question": args.completions,
                "max_new_tokens": args.max_new_tokens,
                "batch_size": args.questions * args.completions,
            },
            "grpo": {"micro_batch_size": args.micro_batch, "drop_zero_variance": False},
            "compute": {"device": args.device, "precision": args.precision},
        }
    )
    learner = Learner(config)
    cuda = learner.policy.device.type == "cuda"
    print(
        f"device {learner.policy.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), "
        f"autocast {learner.policy.autocast}, torch {torch.__version__}"
    )
    print("round  gen_s  update_s  round_s  tokens  peak_GiB")
    rows = []
    for r in range(args.rounds):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        generated = learner.generate(r)
        report = learner.train_round(r, generated)
        if cuda:
            torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
        row = {
            "round": r,
            "generation_s": generated.seconds,
            "update_s": report.update_s,
            "round_s": time.perf_counter() - started,
            "tokens": generated.tokens,
            "peak_gib": peak,
        }
        rows.append(row)
        print(
            f"{r:5d}  {row['generation_s']:5.1f}  {row['update_s']:8.1f}  {row['round_s']:7.1f}  "
            f"{row['tokens']:6d}  {peak:8.2f}",
            flush=True,
        )
    timed = rows[1:] or rows
    print(
        f"mean over rounds 1..{len(rows) - 1}: generation "
        f"{statistics.fmean(r['generation_s'] for r in timed):.1f}s, update "
        f"{statistics.fmean(r['update_s'] for r in timed):.1f}s, round "
        f"{statistics.fmean(r['round_s'] for r in timed):.1f}s; peak GPU memory "
        f"{max(r['peak_gib'] for r in rows):.2f} GiB"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
