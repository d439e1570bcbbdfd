"""The vLLM generation worker: a program run by the vLLM environment's Python, driven by a
node over its standard input and output (sapo_core/policy/vllm_backend.py).

It imports nothing of sapo: vLLM pins its own torch, transformers and fastapi, which do not
resolve beside Prefect's, so it lives in an environment of its own (`sapo vllm install`) and
is run by path (``python -P .../vllm_worker.py``). One JSON object per line each way:

    -> {"op": "start", "model": DIR, "dtype": "bfloat16", "kv_cache_bytes": N, ...}
    <- {"ok": true, "seconds": 28.1}
    -> {"op": "load", "path": DIR}          the trained weights (safetensors), in place
    <- {"ok": true, "seconds": 0.3}
    -> {"op": "generate", "prompts": [[ids]], "n": 4, "temperature": 1.0, "top_p": 1.0,
        "max_tokens": 128, "seed": 7, "stop_token_ids": [2]}
    <- {"ok": true, "completions": [[{"ids": [...], "logprobs": [...], "finished": true}]]}
    -> {"op": "stop"}

A failure is answered ``{"ok": false, "error": "..."}`` and the worker goes on; it ends when
its input closes or its parent dies. vLLM's own output goes to standard error.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any


def _watch_parent(parent: int) -> None:
    """End with the node that started us, even mid-generation."""
    while True:
        if os.getppid() != parent:
            os._exit(3)
        time.sleep(1.0)


def _refresh_cpu_gemms(worker: Any) -> list[str]:
    """Pack again the CPU GEMMs that keep their weight beside a packed copy (the LM head,
    tied to the embedding). vLLM 0.32's in-place reload refreshes the weight, not that copy:
    without this the engine's logits come from the old head (found by
    tests/integration/test_vllm_backend.py; its log-probs then differ from the trainer's)."""
    try:
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    except ImportError:  # another vLLM: nothing of the kind to refresh
        return []
    refreshed = []
    for name, module in worker.get_model().named_modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and weight is not None and weight.numel() > 0:
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            refreshed.append(name)
    return refreshed


class Worker:
    def __init__(self) -> None:
        self.llm: Any = None
        self.lora: Any = None  # the LoRARequest every generation applies (None: no adapter)
        self.adapters_loaded = 0

    def start(self, msg: dict[str, Any]) -> dict[str, Any]:
        # Generation runs in this process: weights are reloaded in place by a method call,
        # and there is no second process to keep alive or to clean up.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # Nodes share the machine's cores (OMP_NUM_THREADS each): no pinning to the first.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM

        began = time.perf_counter()
        kwargs: dict[str, Any] = {
            "model": msg["model"],
            "dtype": msg.get("dtype", "auto"),
            "seed": int(msg.get("seed", 0)),
            "max_model_len": int(msg["max_model_len"]),
            "enable_prefix_caching": True,
            "enforce_eager": bool(msg.get("enforce_eager", True)),
            # The log-prob each token was sampled with (temperature and top-p applied): what
            # a row publishes as its claim (sapo_core/claims.py). The trainer recomputes its
            # own old log-probs under vLLM, so GRPO's ratio never divides by these.
            "logprobs_mode": "processed_logprobs",
        }
        if msg.get("kv_cache_bytes"):
            kwargs["kv_cache_memory_bytes"] = int(msg["kv_cache_bytes"])
        if msg.get("gpu_memory_utilization"):
            kwargs["gpu_memory_utilization"] = float(msg["gpu_memory_utilization"])
        if msg.get("lora_rank"):  # the node trains an adapter: one at a time, of this rank
            kwargs.update(enable_lora=True, max_lora_rank=int(msg["lora_rank"]), max_loras=1)
        self.llm = LLM(**kwargs)
        return {"seconds": time.perf_counter() - began}

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The node's trained weights, in place (no engine reload), and a cold prefix cache:
        cached prompts' keys and values were the old weights'."""
        began = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": msg["path"]})
        self.llm.collective_rpc(_refresh_cpu_gemms)
        self.llm.reset_prefix_cache()
        return {"seconds": time.perf_counter() - began}

    def load_adapter(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The node's adapter, newly trained: a LoRA of a new id (the engine loads it from
        ``path`` at the next generation, evicting the last) and a cold prefix cache."""
        from vllm.lora.request import LoRARequest

        self.adapters_loaded += 1
        n = self.adapters_loaded
        self.lora = LoRARequest(f"policy-{n}", n, str(msg["path"]))
        self.llm.reset_prefix_cache()
        return {"seconds": 0.0}

    def generate(self, msg: dict[str, Any]) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        stops = [int(i) for i in msg["stop_token_ids"]]
        # One seed per prompt, from the call's: two questions never share their draws.
        params = [
            SamplingParams(
                n=int(msg["n"]),
                temperature=float(msg["temperature"]),
                top_p=float(msg["top_p"]),
                max_tokens=int(msg["max_tokens"]),
                seed=(int(msg["seed"]) * 1_000_003 + i) % 2**63,
                stop_token_ids=stops,
                logprobs=0,  # the sampled token's own log-prob
                detokenize=False,  # the node decodes with its own tokenizer
            )
            for i in range(len(msg["prompts"]))
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in msg["prompts"]]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora)
        completions = []
        for output in outputs:
            group = []
            for c in output.outputs:
                ids = list(c.token_ids)
                logprobs = [
                    float(step[tok].logprob)
                    for tok, step in zip(ids, c.logprobs or [], strict=False)
                ]
                # The node keeps the stop token (it learns to stop), as its own sampling
                # loop does; vLLM keeps the model's end-of-sequence token, and may leave out
                # another stop token it was given.
                finished = c.finish_reason == "stop"
                stop = c.stop_reason
                if finished and isinstance(stop, int) and stop in stops and ids[-1:] != [stop]:
                    ids.append(stop)
                    logprobs.append(0.0)
                group.append({"ids": ids, "logprobs": logprobs, "finished": finished})
            completions.append(group)
        return {"completions": completions}


def main() -> None:
    # Replies go to the original standard output; anything vLLM prints goes to stderr.
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    worker = Worker()
    calls = {
        "start": worker.start,
        "load": worker.load,
        "load_adapter": worker.load_adapter,
        "generate": worker.generate,
    }
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        if op == "stop":
            break
        try:
            reply = {"ok": True, **calls[op](msg)}
        except Exception as exc:  # answered: the node decides (restart, or report)
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
