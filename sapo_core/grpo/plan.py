"""How a round's sequences become forward/backward passes, chosen for the device and model.

The update's arithmetic (`logprobs.py`'s plain forward, `loss.py`) is the same whatever the
plan; the plan decides only its schedule and every speed measure: how many completions and
tokens one pass holds, whether log-probs take the shared-prompt path (one packed pass per
prompt and its completions, `shared_prompt.py`: speed code, tested equal to the plain
forward), how long a packed sequence may grow and how much padding a pass may carry,
whether activations are recomputed in the backward (checkpointing), and whether freed pages
go back to the operating system between passes. Each constant says which device it was
measured on. `grpo.plan: plain` turns every speed measure off: the plain forward, no
checkpointing and no memory release unless set, passes bounded as planned (memory, not
speed): the path a reader checks the others against.

- **CPU** (measured on 2 cores, issues 14 and 20): one pass of at most 768 tokens and packed
  sequences of at most 768 (attention over a packed sequence costs its length squared, the
  masked blocks included), a pass's fixed cost taken as 48 tokens, checkpointing on (it
  barely costs on a CPU, whose passes are compute-bound either way, and bounds the laptop's
  memory), glibc's free pages handed back between passes (`sapo_core/memory.py`).
- **GPU**: a pass is as large as the free device memory allows. Its tokens come from a budget
  (a share of the memory free when the update starts, less the gradients and, before the
  optimizer's first step, Adam's moments) over what one token holds between its forward and
  its backward
  (`activation_bytes_per_token`, from the model's shape); checkpointing only when that
  budget without it is too small for a useful pass; no allocator calls between passes.
  Unmeasured here: no GPU was lent to the session that wrote it (see benchmarks/README.md).

`micro_batch_tokens` and `gradient_checkpointing` in GRPOConfig override the plan when set
to a value instead of ``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sapo_core.config import GRPOConfig
from sapo_core.memory import releases_memory

CPU_TOKENS_PER_PASS = 768
"""Tokens (sequences x the longest) of one pass on a CPU: measured best on 2 cores."""
CPU_MAX_PACKED_TOKENS = 768
"""Longest packed sequence on a CPU. Attention over a packed sequence costs its length
squared, the blocks the mask hides included (measured on 2 cores: benchmarks/README.md,
"Figures that code comments used to quote"), so a group with long answers is shared out among
copies of its prompt."""
CPU_PASS_OVERHEAD_TOKENS = 48
"""What one more pass costs beyond its tokens, in tokens of forward and backward: its weight
gradients are added into .grad (a pass over every parameter), which on the bundled model
and 2 cores takes about as long as 50 tokens' forward and backward. A sequence joins a pass
unless the padding it needs would cost more."""
GPU_PASS_OVERHEAD_TOKENS = CPU_PASS_OVERHEAD_TOKENS
"""Not measured on a GPU (none was lent to the sessions that wrote this): the CPU figure,
until the GPU standing order (shared/GPU.md) measures it."""
GPU_MAX_PACKED_TOKENS = 4096
"""Longest packed sequence on a GPU: a group of 8 x 512-token answers in two pieces; the
block mask of one is L^2 bytes (16 MiB), counted in the budget."""
GPU_BUDGET_SHARE = 0.6
"""Share of the free device memory the update's activations may take: the rest is the
allocator's fragmentation, the mask, the chunked head's temporaries and the reference model."""
GPU_MIN_TOKENS_PER_PASS = 8192
"""A pass smaller than this without checkpointing is a poor use of a GPU: below it,
checkpointing (a second forward) buys passes several times as large."""
GPU_MAX_TOKENS_PER_PASS = 131_072
"""An upper bound, whatever the memory: past it a pass gains nothing on any current GPU."""


@dataclass(frozen=True)
class UpdatePlan:
    """How one update is laid out as passes."""

    device: str
    """'cpu' or 'cuda': what the plan was chosen for."""
    micro_batch_size: int
    """Most completions in one pass."""
    tokens_per_pass: int | None
    """Most tokens in one pass (sequences x the longest); None: no cap."""
    max_packed_tokens: int | None
    """Longest packed sequence (a prompt and its completions); a longer group is shared out
    among copies of its prompt. None: no cap (the plain plan)."""
    shared_prompt: bool
    """Log-probs by the shared-prompt path (sapo_core/grpo/shared_prompt.py) instead of the
    plain forward: where the model's family allows it, unless `grpo.plan: plain`."""
    overhead_tokens: int
    """A pass's fixed cost in tokens: the most padding a sequence may bring to join one."""
    checkpointing: bool
    """Recompute each layer's activations in the backward, keeping only its input."""
    release_memory: bool
    """Hand the allocator's free pages back to the OS between passes (glibc, CPU)."""
    budget_bytes: int | None = None
    """Device memory the passes were sized from; None where constants chose."""

    def metrics(self, passes: int) -> dict[str, float]:
        """The plan as a round's metrics, by their MLflow names: the passes it made, its
        cap on tokens per pass (0: none), whether it checkpointed."""
        return {
            "update_passes": float(passes),
            "update_tokens_per_pass": float(self.tokens_per_pass or 0),
            "update_checkpointing": float(self.checkpointing),
        }


def activation_bytes_per_token(
    model_config: Any,
    *,
    checkpointing: bool,
    activation_bytes: int,
    shared_prompt: bool,
    eager: bool = False,
) -> float:
    """What one token holds between its forward and its backward, in bytes, from the
    model's shape (a decoder of `num_hidden_layers` blocks of attention and a gated MLP).

    Per block without checkpointing, the tensors autograd keeps: about 16 of the hidden size
    (the norms' inputs and outputs, queries, keys, values, attention's output, the residual
    sums) and 6 of the MLP's intermediate size (gate, up, their activation and product, the
    fp32 copies a norm makes). With checkpointing only each block's input stays, and one
    block is recomputed at a time. The head: the shared-prompt path runs it in chunks (a
    token keeps its hidden state and a log-normaliser); the plain path keeps the logits of
    the whole vocabulary in fp32, with their log-softmax and its gradient: on a 152k
    vocabulary that is 1.8 MB a token, the largest tensor of the update. Eager attention
    (``eager``) also keeps each head's scores and probabilities over the packed sequence:
    2 x heads x L a token and layer, L the longest packed sequence (SDPA keeps none).
    """
    hidden = int(model_config.hidden_size)
    intermediate = int(getattr(model_config, "intermediate_size", 4 * hidden))
    layers = int(model_config.num_hidden_layers)
    vocab = int(model_config.vocab_size)
    heads = int(getattr(model_config, "num_attention_heads", 1))
    scores = 2 * heads * GPU_MAX_PACKED_TOKENS if eager else 0
    block = (16 * hidden + 6 * intermediate + scores) * activation_bytes
    body = (layers * hidden * activation_bytes + block) if checkpointing else layers * block
    head = (hidden * 4 + 8) if shared_prompt else vocab * 4 * 3
    return float(body + head)


def _tokens(config: GRPOConfig, planned: int) -> int | None:
    """The tokens per pass: the config's when it sets them (None: no cap), else ``planned``."""
    given = config.micro_batch_tokens
    return planned if isinstance(given, str) else given


def _checkpointing(config: GRPOConfig, planned: bool) -> bool:
    given = config.gradient_checkpointing
    return planned if isinstance(given, str) else given


def plan_update(
    config: GRPOConfig,
    model_config: Any,
    *,
    device: str,
    free_bytes: int | None = None,
    reserved_bytes: int = 0,
    activation_bytes: int = 4,
    shared_prompt: bool = True,
    eager: bool = False,
) -> UpdatePlan:
    """The plan for an update on ``device`` ('cpu' or 'cuda'), of a model of
    ``model_config``'s shape whose activations take ``activation_bytes`` each (2 under bf16
    autocast). On a GPU, ``free_bytes`` is the device memory free when the update starts, of
    which ``reserved_bytes`` will go to what the update allocates besides activations (the
    gradients, and Adam's moments at its first step). `micro_batch_tokens` and
    `gradient_checkpointing` set to a value win over the plan's; checkpointing left to the
    plan is then chosen for the tokens the config set."""
    plain = config.plan == "plain"  # the reader's path: no speed measure, passes bounded
    shared_prompt = shared_prompt and not plain
    if device != "cuda" or free_bytes is None:
        planned = UpdatePlan(
            device=device,
            micro_batch_size=config.micro_batch_size,
            tokens_per_pass=_tokens(config, CPU_TOKENS_PER_PASS),
            max_packed_tokens=CPU_MAX_PACKED_TOKENS,
            shared_prompt=shared_prompt,
            overhead_tokens=CPU_PASS_OVERHEAD_TOKENS,
            checkpointing=_checkpointing(config, not plain),
            release_memory=releases_memory(device),
        )
        return _without_speed(planned) if plain else planned
    budget = int(max(free_bytes - reserved_bytes, 0) * GPU_BUDGET_SHARE)

    def fitting(checkpointing: bool) -> int:
        per_token = activation_bytes_per_token(
            model_config,
            checkpointing=checkpointing,
            activation_bytes=activation_bytes,
            shared_prompt=shared_prompt,
            eager=eager,
        )
        # The packed block mask is L^2 bytes a sequence: per token, L bytes at most.
        return max(int(budget / (per_token + GPU_MAX_PACKED_TOKENS)), 1)

    given = config.micro_batch_tokens
    if plain:  # checkpointing is a speed measure's trade: only where the config sets it
        needed = False
    elif isinstance(given, str):  # auto: checkpoint only when the budget needs it
        needed = fitting(False) < GPU_MIN_TOKENS_PER_PASS
    else:  # the config's cap: checkpoint if it does not fit without
        needed = given is None or given > fitting(False)
    checkpointing = _checkpointing(config, needed)
    tokens = _tokens(config, min(fitting(checkpointing), GPU_MAX_TOKENS_PER_PASS))
    planned = UpdatePlan(
        device="cuda",
        micro_batch_size=config.micro_batch_size,
        tokens_per_pass=tokens,
        max_packed_tokens=min(GPU_MAX_PACKED_TOKENS, tokens or GPU_MAX_PACKED_TOKENS),
        shared_prompt=shared_prompt,
        overhead_tokens=GPU_PASS_OVERHEAD_TOKENS,
        checkpointing=checkpointing,
        release_memory=False,
        budget_bytes=budget,
    )
    return _without_speed(planned) if plain else planned


def _without_speed(planned: UpdatePlan) -> UpdatePlan:
    """The plain plan: the same passes, with no packing cap, no padding allowance and no
    allocator calls (checkpointing was chosen for it already)."""
    return replace(planned, max_packed_tokens=None, overhead_tokens=0, release_memory=False)


def plan_for(model: Any, config: GRPOConfig, optimizer: Any = None) -> UpdatePlan:
    """The plan for updating ``model`` where it is, now: its device, the memory free there
    (within `device_memory_gib` where set) less what the update allocates besides
    activations (gradients, freed after each update, and Adam's two moments if
    ``optimizer`` has none yet), the format its activations take
    under the precision in force (bf16 autocast: 2 bytes), its attention, and whether its
    log-probs take the shared-prompt path."""
    import torch

    from sapo_core.grpo.optimizer import device_bytes, moment_bytes
    from sapo_core.grpo.shared_prompt import supports_shared_prompt

    weight = next(model.parameters())
    device = weight.device
    if device.type != "cuda":  # constants plan the CPU: nothing to measure
        return plan_update(
            config, model.config, device=device.type, shared_prompt=supports_shared_prompt(model)
        )
    free = torch.cuda.mem_get_info(device)[0]
    if config.device_memory_gib is not None:  # plan as on a card of that size
        free = min(free, device_bytes(device, config) - torch.cuda.memory_allocated(device))
    trained = [p for p in model.parameters() if p.requires_grad]
    trainable = sum(p.numel() * p.element_size() for p in trained)
    moments = moment_bytes(optimizer, sum(p.numel() for p in trained), trainable)
    reserved = trainable + moments  # the gradients, and Adam's moments before its first step
    autocast = torch.is_autocast_enabled(device.type)
    dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
    shape = getattr(model.config, "text_config", None) or model.config
    return plan_update(
        config,
        shape,
        device=device.type,
        free_bytes=free,
        reserved_bytes=reserved,
        activation_bytes=dtype.itemsize,
        shared_prompt=supports_shared_prompt(model),
        eager=getattr(model.config, "_attn_implementation", None) == "eager",
    )
