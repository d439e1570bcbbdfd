"""vLLM against the transformers loop, side by side in one run: generation tokens/s on short
and long prompts (32 sequences each), seconds per round (generate, score, update), the
weight-sync time, and peak RSS (the node's process, and vLLM's worker).

The bundled SmolLM2-135M-Instruct; 8 prompts x 4 completions x up to 128 new tokens per
call; prompts of ~40 tokens (short) or ~600 (long, a question behind few-shot text).
Each backend runs in its own child process, so that each process's peak RSS is its own;
the first call of each backend warms up and is left out.

    python benchmarks/generation_backends.py            # needs `sapo vllm install`
    python benchmarks/generation_backends.py --rounds 3 --max-new-tokens 64
    python benchmarks/generation_backends.py --backends vllm-lora,vllm-merged  # issue 31

`vllm-lora` and `vllm-merged` train a LoRA adapter (rank 8) and give it to the engine as an
adapter the engine applies, or as merged weights written each update
(`generation.vllm.adapter_sync`): which is faster per round.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FILLER = (
    "Here is how a careful solver works. It reads the question twice, writes down what is "
    "given, names what is asked, and checks the units before it answers. "
)


def prompts(tokenizer: Any, long: bool) -> list[list[int]]:
    questions = [f"What is {a} + {b} * {a - 1}? Answer in <answer> tags." for a, b in
                 zip(range(3, 11), range(17, 25), strict=True)]  # fmt: skip
    if long:
        questions = [FILLER * 16 + q for q in questions]
    chats = [[{"role": "user", "content": q}] for q in questions]
    return [
        tokenizer.apply_chat_template(c, add_generation_prompt=True, return_dict=False)
        for c in chats
    ]


BACKENDS = ("transformers", "vllm", "vllm-lora", "vllm-merged")


def measure(variant: str, rounds: int, max_new_tokens: int) -> dict[str, Any]:
    """One backend, in this process: generation per prompt length, then whole rounds."""
    from sapo_core import config as c
    from sapo_core.learner import Learner

    backend_name, _, adapter_sync = variant.partition("-")
    generation = c.GenerationConfig(
        backend=backend_name, completions_per_question=4, max_new_tokens=max_new_tokens,
        batch_size=32, vllm=c.VLLMConfig(adapter_sync=adapter_sync or "merged"),
    )  # fmt: skip
    lora = c.AdapterConfig(kind="lora", rank=8, alpha=16) if adapter_sync else c.AdapterConfig()
    config = c.NodeConfig(
        node_id="bench",
        model=c.BUNDLED_MODEL,
        local_groups=8,
        tasks=c.TaskConfig(specs=(c.TaskSpec(name="basic_arithmetic"),)),
        generation=generation,
        grpo=c.GRPOConfig(drop_zero_variance=False, adapter=lora),
    )
    learner = Learner(config)
    out: dict[str, Any] = {"backend": variant}
    try:
        tokenizer = learner.policy.tokenizer
        for label, long in (("short", False), ("long", True)):
            batch = prompts(tokenizer, long)
            rates = []
            for call in range(rounds + 1):
                began = time.perf_counter()
                groups = learner.backend.generate(batch, generation, seed=call)
                seconds = time.perf_counter() - began
                tokens = sum(len(c.token_ids) for g in groups for c in g)
                if call:  # the first warms up (vLLM: the engine starts)
                    rates.append(tokens / seconds)
            out[f"tokens_per_s_{label}"] = statistics.mean(rates)
            out[f"prompt_tokens_{label}"] = statistics.mean(len(p) for p in batch)
        round_s, sync_s = [], []
        for round_ in range(rounds + 1):
            began = time.perf_counter()
            generated = learner.generate(round_)
            chosen, flagged = learner.select(round_, generated.groups, [])
            learner.update(round_, chosen, flagged)
            if round_:
                round_s.append(time.perf_counter() - began)
            if backend_name == "vllm":
                backend: Any = learner.backend
                began = time.perf_counter()
                backend._ensure_started()
                backend._sync_weights()  # what the next generation does first
                sync_s.append(time.perf_counter() - began)
        out["seconds_per_round"] = statistics.mean(round_s)
        out["sync_seconds"] = statistics.mean(sync_s) if sync_s else None
        out["node_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if backend_name == "vllm":
            import psutil

            proc = psutil.Process(learner.backend._proc.pid)  # type: ignore[attr-defined]
            out["worker_rss_gb"] = proc.memory_info().rss / 2**30
            out["worker_kv_cache_gb"] = learner.backend.kv_bytes / 2**30  # type: ignore[attr-defined]
    finally:
        learner.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--backends", default="transformers,vllm", help=", ".join(BACKENDS))
    parser.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.rounds, args.max_new_tokens)))
        return
    print(f"load average {os.getloadavg()[0]:.2f} (measure on an idle machine)")
    rows = []
    names = args.backends.split(",")
    if unknown := set(names) - set(BACKENDS):
        raise SystemExit(f"unknown backends {sorted(unknown)}: choose from {', '.join(BACKENDS)}")
    for name in names:
        cmd = [sys.executable, __file__, "--one", name, "--rounds", str(args.rounds),
               "--max-new-tokens", str(args.max_new_tokens)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    keys = ["tokens_per_s_short", "tokens_per_s_long", "seconds_per_round", "sync_seconds",
            "node_peak_rss_gb", "worker_rss_gb", "worker_kv_cache_gb"]  # fmt: skip
    print("| figure | " + " | ".join(r["backend"] for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for key in keys:
        cells = [r.get(key) for r in rows]
        shown = ["-" if c is None else f"{c:.2f}" for c in cells]
        print(f"| {key} | " + " | ".join(shown) + " |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
