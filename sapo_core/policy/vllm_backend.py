"""Generation on vLLM, in a worker process of its own environment (sapo_core/policy/
vllm_worker.py says why), behind the same interface as the transformers loop.

The node keeps training with its own model; vLLM samples. Before each generation whose
weights changed since the last (an update, a restored checkpoint), the policy's weights are
written as safetensors to a folder in shared memory (/dev/shm where there is one) and
reloaded by the engine in place; its prefix cache is reset with them. The completions'
token ids come back; the node decodes them with its own tokenizer. vLLM's log-probs are
recorded with the rollouts but never divided by: the update recomputes the behaviour
log-probs with the training forward (as for reduced-precision generation), so GRPO's ratio
is the trainer's own and starts at 1.

A LoRA node (sapo_core/policy/adapter.py) reaches the engine one of two ways
(``generation.vllm.adapter_sync``): `merged` (default), the adapter is folded into the weights
as they are written, shard by shard without a second model (sapo_core/policy/
merged_weights.py), and the engine reloads them whole as for full fine-tuning; `lora`, the
engine serves the frozen base (linked from where it lies, never copied) with the adapter,
and an update writes the adapter alone (megabytes) for the engine to load as a new LoRA.

A worker that dies is started again once per call, with the current weights, and the call
repeated; a second death is an error naming the worker's last words. It never hangs a
node: each reply is awaited while the worker lives, and at most ``reply_timeout_s``.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from sapo_core.config import GenerationConfig, VLLMConfig
from sapo_core.policy import adapter as adapters
from sapo_core.policy.backend import Completion, ProgressCallback, Prompt, stop_text_end
from sapo_core.policy.bundled import default_env
from sapo_core.policy.hf_backend import stop_token_ids
from sapo_core.policy.loading import Policy
from sapo_core.policy.merged_weights import save_merged

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("vllm_worker.py")


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's engine can be sized for (its `max_lora_rank`)."""
ADAPTER = "adapter"  # the adapter's folder, beside the engine's model files


def engine_lora_rank(rank: int) -> int:
    """The smallest rank the engine takes that holds an adapter of ``rank``."""
    for fits in VLLM_LORA_RANKS:
        if fits >= rank:
            return fits
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest, {VLLM_LORA_RANKS[-1]}")


INSTALL_HINT = "run `sapo vllm install` (CPU) or `sapo vllm install --gpu` (CUDA)"


class VLLMUnavailable(RuntimeError):
    """The vLLM environment is missing: one line naming the command that makes it."""


def worker_python(config: VLLMConfig) -> Path:
    """The vLLM environment's interpreter, or VLLMUnavailable saying how to make one."""
    python = Path(config.python) if config.python else default_env() / "bin" / "python"
    if not python.is_file():
        raise VLLMUnavailable(
            f"generation.backend is vllm but {python} does not exist: {INSTALL_HINT}"
        )
    return python


def kv_cache_bytes(model_config: Any, sequences: int, max_model_len: int, dtype_bytes: int) -> int:
    """Keys and values of ``sequences`` sequences of ``max_model_len`` tokens: what one
    generation call of the node can hold at once (vLLM's own CPU default took 16.75 GiB)."""
    layers = int(model_config.num_hidden_layers)
    heads = int(
        getattr(model_config, "num_key_value_heads", None) or model_config.num_attention_heads
    )
    head_dim = int(
        getattr(model_config, "head_dim", None)
        or model_config.hidden_size // model_config.num_attention_heads
    )
    per_token = 2 * layers * heads * head_dim * dtype_bytes
    return max(per_token * sequences * max_model_len, 64 * 2**20)


class VLLMBackend:
    """Samples with vLLM in a worker process; ``weights_changed()`` after each update."""

    exact_logprobs = False
    """vLLM's log-probs are not the training forward's: the update recomputes them."""

    def __init__(
        self, policy: Policy, generation: GenerationConfig, *, stop_texts: Sequence[str] = ()
    ) -> None:
        self.policy = policy
        # Stop texts are cut in the node with its own tokenizer (the worker does not
        # detokenize): vLLM samples to a stop token or the limit, the rest is dropped.
        self.stop_texts = tuple(stop_texts)
        self.config = generation.vllm
        self.python = worker_python(self.config)
        self.stop_ids = sorted(stop_token_ids(policy.tokenizer, policy.model))
        self.serves_adapter = (
            adapters.is_adapted(policy.model) and self.config.adapter_sync == "lora"
        )
        self._proc: subprocess.Popen[str] | None = None
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._stale = True  # the engine does not hold the policy's current weights
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self._folder = Path(tempfile.mkdtemp(prefix="sapo-vllm-", dir=base))
        self._log = self._folder.with_suffix(".log")
        self.max_model_len = self.config.max_model_len
        dtype_bytes = 4 if self.config.dtype == "float32" else 2
        self.kv_bytes = (
            self.config.kv_cache_mb * 2**20
            if self.config.kv_cache_mb
            else kv_cache_bytes(
                policy.model.config, generation.batch_size, self.max_model_len, dtype_bytes
            )
        )

    # -- the interface -------------------------------------------------------------------

    def weights_changed(self) -> None:
        """The policy was updated (or restored): the next generation reloads its weights."""
        self._stale = True

    def generate(
        self,
        prompts: Sequence[Prompt],
        config: GenerationConfig,
        seed: int,
        on_progress: ProgressCallback | None = None,
    ) -> list[list[Completion]]:
        n = config.completions_per_question
        rows = [self._ids(p) for p in prompts]
        request = {
            "op": "generate",
            "prompts": rows,
            "n": n,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_tokens": config.max_new_tokens,
            "seed": int(seed),
            "stop_token_ids": self.stop_ids,
        }
        reply = self._call_fresh(request)
        groups = [[self._completion(c) for c in group] for group in reply["completions"]]
        if on_progress is not None:
            on_progress(len(prompts) * n, len(prompts) * n)
        return groups

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                    proc.stdin.flush()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        shutil.rmtree(self._folder, ignore_errors=True)

    # -- the worker ----------------------------------------------------------------------

    def _call_fresh(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request`` answered by a worker holding the current weights; a worker that
        died is started again once, and the request repeated."""
        for attempt in (1, 2):
            try:
                self._ensure_started()
                if self._stale:
                    self._sync_weights()
                return self._call(request)
            except WorkerDied as exc:
                self._proc = None
                self._stale = True
                if attempt == 2:
                    raise RuntimeError(f"the vLLM worker died twice: {exc}") from exc
                log.warning("the vLLM worker died (%s): starting it again", exc)
        raise AssertionError("unreachable")

    def _ensure_started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self._write_weights(with_tokenizer=True)
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        with open(self._log, "a") as err:
            self._proc = subprocess.Popen(
                [str(self.python), "-P", str(WORKER)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
                env=env,
            )
        self._replies = queue.Queue()
        assert self._proc.stdout is not None
        threading.Thread(target=_pump, args=(self._proc.stdout, self._replies), daemon=True).start()
        rank = adapters.rank(self.policy.model) if self.serves_adapter else None
        started = self._call(
            {
                "op": "start",
                "lora_rank": engine_lora_rank(rank) if rank else None,
                "model": str(self._folder),
                "dtype": self.config.dtype,
                "seed": 0,
                "max_model_len": self.max_model_len,
                "kv_cache_bytes": self.kv_bytes if self.policy.device.type == "cpu" else None,
                "gpu_memory_utilization": self.config.gpu_memory_utilization,
                "enforce_eager": self.config.enforce_eager,
            }
        )
        log.info("vLLM engine ready in %.1f s", started["seconds"])
        # It loaded the weights just written; an engine serving an adapter has the base alone.
        self._stale = self.serves_adapter

    def _sync_weights(self) -> None:
        if self.serves_adapter:
            self.policy.model.save_pretrained(self._folder / ADAPTER)  # the adapter alone
            self._call({"op": "load_adapter", "path": str(self._folder / ADAPTER)})
        else:
            self._write_weights(with_tokenizer=False)
            self._call({"op": "load", "path": str(self._folder)})
        self._stale = False

    def _write_weights(self, *, with_tokenizer: bool) -> None:
        """The policy as a model folder vLLM reads (config and weights; the tokenizer too when
        the engine starts on it). For an engine serving an adapter: the base's files, linked."""
        model = self.policy.model
        if with_tokenizer:
            self.policy.tokenizer.save_pretrained(self._folder)
        if self.serves_adapter:
            base = Path(adapters.base_directory(model))
            for source in base.iterdir():
                target = self._folder / source.name
                if source.is_file() and not target.exists():
                    target.symlink_to(source.resolve())
            return
        if adapters.is_adapted(model):
            # folded shard by shard: no second model in memory, the adapter trains on
            save_merged(model, self._folder)
            return
        # save_pretrained writes tied weights once and in the names vLLM's loaders expect
        model.save_pretrained(self._folder, safe_serialization=True)

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except OSError as exc:
            raise WorkerDied(self._last_words(str(exc))) from exc
        deadline = time.monotonic() + self.config.reply_timeout_s
        while True:
            try:
                line = self._replies.get(timeout=1.0)
            except queue.Empty:
                if proc.poll() is not None:
                    raise WorkerDied(self._last_words(f"exit code {proc.returncode}")) from None
                if time.monotonic() > deadline:
                    proc.kill()
                    raise WorkerDied(self._last_words("no reply in time")) from None
                continue
            if line is None:
                proc.wait()
                raise WorkerDied(self._last_words(f"exit code {proc.returncode}"))
            reply: dict[str, Any] = json.loads(line)
            if not reply.get("ok"):
                raise RuntimeError(f"vLLM worker: {request['op']} failed: {reply.get('error')}")
            return reply

    def _last_words(self, why: str) -> str:
        try:
            tail = self._log.read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        return f"{why}; its log {self._log} ends: {' | '.join(tail) or '(empty)'}"

    # -- conversions ---------------------------------------------------------------------

    def _ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.policy.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        return [int(i) for i in prompt]

    def _completion(self, raw: dict[str, Any]) -> Completion:
        ids = tuple(int(i) for i in raw["ids"])
        logprobs = tuple(float(x) for x in raw["logprobs"])
        finished = bool(raw["finished"])
        end = stop_text_end(self.policy.tokenizer, ids, self.stop_texts)
        if end is not None:
            ids, logprobs, finished = ids[:end], logprobs[:end], True
        text = self.policy.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Completion(text, ids, logprobs, finished)


class WorkerDied(RuntimeError):
    """The worker process ended (or stopped answering) before replying."""


def _pump(stream: IO[str], replies: queue.Queue[str | None]) -> None:
    """The worker's reply lines into a queue; None when its output closes."""
    for line in stream:
        replies.put(line)
    replies.put(None)
