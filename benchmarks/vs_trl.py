"""A sapo node against TRL's GRPOTrainer, side by side, on the same model and workload.

The peers' workload: one node, the bundled SmolLM2-135M-Instruct (fp32, full fine-tuning),
8 reasoning-gym `chain_sum` questions x 4 completions x <= 128 new tokens per round, one
optimizer step over all 32 sequences (gradients accumulated over micro-batches: TRL's of 8
sequences, sapo's by its defaults, at most 768 packed tokens with activation
checkpointing; `--grpo KEY=VALUE` changes them), the same loss (`grpo`, eps 0.2 / 0.28,
beta 0, max grad norm 1, lr 1e-5), every group trained on
(TRL keeps all-equal groups; so does sapo here). Two prompt lengths:

- short: system prompt "Answer with the final number." (~45 prompt tokens);
- long: reasoning-gym's default system prompt (~115 prompt tokens).

Each side runs in its own process, one after the other, so each has the machine to itself
and its peak RSS is its own. The first round of each is a warm-up and is left out.

On a GPU (issue 44's workload): `--device cuda --arch qwen2.5-0.5b` (or `qwen2.5-1.5b`)
takes random weights of that published architecture with the bundled tokenizer (nothing can
be fetched there; a random model never stops, so every completion runs to the limit), bf16
autocast over fp32 weights on both sides, and prints generation tokens/s and peak GPU memory
per side; `--adapter lora` trains a rank-8 LoRA on both. `--arch tiny-qwen` is Qwen's
vocabulary on a tiny body: the same run end to end on a CPU.

    python benchmarks/vs_trl.py                       # both prompt lengths, 3 rounds each
    python benchmarks/vs_trl.py --prompts long --rounds 4
    python benchmarks/vs_trl.py --prompts short --sides sapo sapo-plain trl   # the plan's worth
    python benchmarks/vs_trl.py --device cuda --arch qwen2.5-0.5b --prompts short \\
        --questions 8 --completions 8 --max-new-tokens 512 --micro-batch 16
    python benchmarks/vs_trl.py --arch tiny-qwen --prompts short --rounds 2 \\
        --max-new-tokens 16 --adapter lora             # the GPU run's path, on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_round import ARCHS, build_model  # benchmarks/ is the script's folder

from sapo_core.config import NodeConfig

QUESTIONS, COMPLETIONS, MAX_NEW_TOKENS, MICRO_BATCH = 8, 4, 128, 8
"""The default workload (the CPU peers'); --questions etc. change it for a run."""
TASK_NAME = "chain_sum"
TASK_CONFIG: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "max_digits": 1}
SHORT_PROMPT = "Answer with the final number."


def system_prompt(kind: str) -> str:
    if kind == "short":
        return SHORT_PROMPT
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return str(SYSTEM_PROMPTS["default"])


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# --- sapo -------------------------------------------------------------------------------


# sapo's sides, as (generation precision, GRPOConfig settings): the node's default (bf16
# sampling where the CPU has native bf16, behaviour log-probs from the fp32 training
# forward), fp32 generation throughout, and the plain plan (grpo.plan: plain, issue 59: the
# plain forward per completion, no speed measure) whose cost the plan's measures save.
SAPO_SIDES: dict[str, tuple[str, dict[str, Any]]] = {
    "sapo": ("auto", {}),
    "sapo-fp32": ("fp32", {}),
    "sapo-plain": ("auto", {"plan": "plain"}),
}


def sapo_config(
    kind: str,
    seed: int,
    grpo: dict[str, Any] | None = None,
    generation_precision: str = "auto",
    workload: argparse.Namespace | None = None,
) -> NodeConfig:
    """The node's config for this workload (`kind`: short or long prompts); `grpo`
    overrides GRPOConfig fields; `workload` the run's model, device, sizes and adapter."""
    w = workload or argparse.Namespace(
        model=None, device="cpu", adapter="none", questions=QUESTIONS,
        completions=COMPLETIONS, max_new_tokens=MAX_NEW_TOKENS,
    )  # fmt: skip
    adapter = {"kind": "lora", "rank": 8, "alpha": 16} if w.adapter == "lora" else {}
    return NodeConfig.model_validate(
        {
            "node_id": "bench",
            **({"model": w.model} if w.model else {}),
            "local_groups": w.questions,
            "external_groups": 0,
            "seed": seed,
            "tasks": {"specs": [{"name": TASK_NAME, "config": TASK_CONFIG}]},
            "prompt": {"system_prompt": system_prompt(kind)},
            "reward": {"extraction": "last_number"},
            "generation": {
                "completions_per_question": w.completions,
                "max_new_tokens": w.max_new_tokens,
                "temperature": 1.0,
                "batch_size": w.questions * w.completions,
            },
            # else sapo's defaults (its update planned for the device)
            "grpo": {"drop_zero_variance": False, "adapter": adapter, **(grpo or {})},
            "compute": {"device": w.device, "generation_precision": generation_precision},
        }
    )


def run_sapo(
    kind: str,
    rounds: int,
    seed: int,
    grpo: dict[str, Any],
    side: str,
    workload: argparse.Namespace | None = None,
) -> list[dict[str, float]]:
    from sapo_core.learner import Learner

    precision, settings = SAPO_SIDES[side]
    learner = Learner(sapo_config(kind, seed, {**settings, **grpo}, precision, workload))
    sampling = learner.policy.sampling_dtype
    print(f"{side}: generation samples in {sampling or 'fp32'}", file=sys.stderr, flush=True)
    rows = []
    for r in range(rounds):
        started = time.perf_counter()
        generated = learner.generate(r)
        report = learner.train_round(r, generated)
        rows.append(
            {
                "round_s": time.perf_counter() - started,
                "generation_s": generated.seconds,
                "update_s": report.update_s,
                "tokens": generated.tokens,
                "passes": report.update.get("update_passes", 0.0),
            }
        )
        print(f"sapo {kind} round {r}: {rows[-1]}", file=sys.stderr, flush=True)
    return rows


# --- TRL --------------------------------------------------------------------------------


def run_trl(
    kind: str, rounds: int, seed: int, workload: argparse.Namespace | None = None
) -> list[dict[str, float]]:
    import reasoning_gym
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from sapo_core.config import BUNDLED_MODEL
    from sapo_core.policy.loading import load_model, load_tokenizer
    from sapo_core.prompts import extract_answer

    w = workload or argparse.Namespace(
        model=None, device="cpu", adapter="none", questions=QUESTIONS,
        completions=COMPLETIONS, max_new_tokens=MAX_NEW_TOKENS, micro_batch=MICRO_BATCH,
    )  # fmt: skip
    questions = reasoning_gym.create_dataset(
        TASK_NAME, size=w.questions * rounds, seed=seed, **TASK_CONFIG
    )
    system = system_prompt(kind)
    data = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": entry["question"]},
                ],
                "answer": str(entry["answer"]),
            }
            for entry in questions
        ]
    )

    def correct(completions: list[Any], answer: list[str], **_: Any) -> list[float | None]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        pairs = zip(texts, answer, strict=True)
        return [float(extract_answer(t, "last_number") == a) for t, a in pairs]

    rows: list[dict[str, float]] = []
    pending: dict[str, float] = {}

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            pending["generation_s"] = pending.get("generation_s", 0.0) + (
                time.perf_counter() - started
            )
            pending["tokens"] = pending.get("tokens", 0.0) + float(out["completion_mask"].sum())
            return out

    class Rounds(TrainerCallback):
        last = 0.0

        def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
            self.last = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            now = time.perf_counter()
            row = {"round_s": now - self.last, **pending}
            row["update_s"] = row["round_s"] - row.get("generation_s", 0.0)
            rows.append(row)
            pending.clear()
            print(f"trl {kind} round {len(rows) - 1}: {row}", file=sys.stderr, flush=True)
            self.last = now

    tokenizer = load_tokenizer(w.model or BUNDLED_MODEL)
    model = load_model(w.model or BUNDLED_MODEL)
    cuda = w.device == "cuda"
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        use_cpu=not cuda,
        bf16=cuda,  # autocast over fp32 weights, as sapo's compute.precision auto there
        seed=seed,
        max_steps=rounds,
        per_device_train_batch_size=w.micro_batch,
        gradient_accumulation_steps=w.questions * w.completions // w.micro_batch,
        num_generations=w.completions,
        max_completion_length=w.max_new_tokens,
        temperature=1.0,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="grpo",
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        scale_rewards="group",
        shuffle_dataset=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        dataloader_num_workers=0,
    )
    peft_config = None
    if w.adapter == "lora":  # sapo's: rank 8, alpha 16, peft's default modules
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    trainer = Timed(
        model=model,
        reward_funcs=correct,
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Rounds()],
        peft_config=peft_config,
    )
    trainer.train()
    return rows


# --- the comparison ---------------------------------------------------------------------


def summarise(rows: list[dict[str, float]], peak: float, peak_gpu: float) -> dict[str, float]:
    timed = rows[1:] or rows  # the first round warms up
    tokens = sum(r["tokens"] for r in timed)
    generation = sum(r["generation_s"] for r in timed)
    return {
        "rounds": len(timed),
        "round_s": statistics.fmean(r["round_s"] for r in timed),
        "generation_s": statistics.fmean(r["generation_s"] for r in timed),
        "update_s": statistics.fmean(r["update_s"] for r in timed),
        "tokens": tokens / len(timed),
        "gen_tokens_per_s": tokens / max(generation, 1e-9),
        "s_per_1k": 1000 * sum(r["round_s"] for r in timed) / tokens,
        "peak_gb": peak,
        "peak_gpu_gb": peak_gpu,
    }


def grpo_setting(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def child(args: argparse.Namespace) -> None:
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    if args.memory_gib and args.device == "cuda":  # both sides on a card of that size
        import torch

        total = torch.cuda.mem_get_info()[1]
        torch.cuda.set_per_process_memory_fraction(min(args.memory_gib * 2**30 / total, 1.0))
    if args.side in SAPO_SIDES:
        grpo = dict(args.grpo)
        if args.memory_gib:
            grpo.setdefault("device_memory_gib", args.memory_gib)  # and its plan knows it
        rows = run_sapo(args.prompt, args.rounds, args.seed, grpo, args.side, args)
    else:
        rows = run_trl(args.prompt, args.rounds, args.seed, args)
    import torch

    cuda = torch.cuda.is_available() and args.device == "cuda"
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    print(json.dumps({"rows": rows, "peak_gb": peak_rss_gb(), "peak_gpu_gb": peak_gpu}))


def measure(side: str, kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side's run in its own process: its summary, or {"failed": its last error line}
    (a side out of memory on an emulated card is a result, not the end of the run)."""
    cmd = [sys.executable, __file__, "--side", side, "--prompt", kind]
    cmd += ["--rounds", str(args.rounds), "--seed", str(args.seed)]
    cmd += ["--device", args.device, "--adapter", args.adapter]
    cmd += ["--questions", str(args.questions), "--completions", str(args.completions)]
    cmd += ["--max-new-tokens", str(args.max_new_tokens), "--micro-batch", str(args.micro_batch)]
    if args.model:
        cmd += ["--model", args.model]
    if args.memory_gib:
        cmd += ["--memory-gib", str(args.memory_gib)]
    for key, value in args.grpo:
        cmd += ["--grpo", f"{key}={json.dumps(value)}"]
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as run:  # its progress passes through as it comes; its last line is kept
        last = ""
        for line in run.stderr or ():
            sys.stderr.write(line)
            if re.match(r"[\w.]+(Error|Exception)\b", line) or not last:
                last = line.strip()  # the exception's own line, e.g. CUDA out of memory
        out = (run.stdout.read() if run.stdout else "").strip()
    if run.returncode:
        return {"failed": (last or f"exit {run.returncode}")[:160]}
    result = json.loads(out.splitlines()[-1])
    return summarise(result["rows"], result["peak_gb"], result.get("peak_gpu_gb", 0.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompts", nargs="+", choices=["short", "long"], default=["short", "long"])
    side_names = [*SAPO_SIDES, "trl"]
    p.add_argument("--sides", nargs="+", choices=side_names, default=["sapo", "trl"])
    p.add_argument("--rounds", type=int, default=3, help="rounds per run, the first a warm-up")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the summaries here")
    p.add_argument(
        "--grpo",
        type=grpo_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a sapo GRPOConfig field for this run, e.g. micro_batch_tokens=512 (repeatable)",
    )
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument(
        "--arch",
        choices=["bundled", *ARCHS],
        default="bundled",
        help="bundled: SmolLM2-135M's weights; else random weights of that architecture",
    )
    p.add_argument("--layers", type=int, help="fewer layers than the architecture's (smoke runs)")
    p.add_argument("--adapter", choices=["none", "lora"], default="none")
    p.add_argument("--questions", type=int, default=QUESTIONS)
    p.add_argument("--completions", type=int, default=COMPLETIONS)
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    p.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="TRL's per-device batch")
    p.add_argument(
        "--memory-gib",
        type=float,
        help="on a GPU: both sides as on a card of this size (torch's per-process memory "
        "fraction; sapo's grpo.device_memory_gib), e.g. 20 for the 24 GB cards users run",
    )
    p.add_argument("--side", choices=side_names, help=argparse.SUPPRESS)
    p.add_argument("--prompt", choices=["short", "long"], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.side:
        child(args)
        return
    if args.arch != "bundled":
        folder = Path(tempfile.mkdtemp(prefix=f"{args.arch}-random-"))
        args.model = str(build_model(folder, args.layers, ARCHS[args.arch]))
    print(f"load before: {os.getloadavg()[0]:.2f}; {args.rounds} rounds per run, first excluded")
    if args.grpo:
        print(f"sapo's GRPO settings: {dict(args.grpo)}")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for kind in args.prompts:
        for side in args.sides:
            results.setdefault(kind, {})[side] = measure(side, kind, args)
    print(
        f"arch {args.arch}, device {args.device}, adapter {args.adapter}, "
        f"{args.questions} x {args.completions} x <= {args.max_new_tokens} tokens"
        + (f", a {args.memory_gib} GiB card" if args.memory_gib else "")
    )
    header = (
        "prompts  side           s/round  gen_s  update_s  tokens/round  gen_tok/s  "
        "s/1k_tok  peak_GB  peak_GPU_GB"
    )
    print(header)
    for kind, sides in results.items():
        for side, s in sides.items():
            if "failed" in s:
                print(f"{kind:7}  {side:13}  failed: {s['failed']}")
                continue
            print(
                f"{kind:7}  {side:13}  {s['round_s']:7.1f}  {s['generation_s']:5.1f}  "
                f"{s['update_s']:8.1f}  {s['tokens']:12.0f}  {s['gen_tokens_per_s']:9.0f}  "
                f"{s['s_per_1k']:8.1f}  {s['peak_gb']:7.2f}  {s['peak_gpu_gb']:11.2f}"
            )
        ran = {name for name, s in sides.items() if "failed" not in s}
        compared = [name for name in SAPO_SIDES if name in ran and "trl" in ran]
        for name in compared:
            a, b = sides[name], sides["trl"]
            print(
                f"{kind:7}  {name + '/trl':13}  {a['round_s'] / b['round_s']:7.2f}  "
                f"{a['generation_s'] / b['generation_s']:5.2f}  "
                f"{a['update_s'] / b['update_s']:8.2f}  {'':12}  "
                f"{a['gen_tokens_per_s'] / b['gen_tokens_per_s']:9.2f}  "
                f"{a['s_per_1k'] / b['s_per_1k']:8.2f}  {a['peak_gb'] / b['peak_gb']:7.2f}  "
                f"{a['peak_gpu_gb'] / b['peak_gpu_gb'] if b['peak_gpu_gb'] else 0.0:11.2f}"
            )
    print(f"load after: {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
