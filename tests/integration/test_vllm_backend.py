"""Generation on vLLM for real: its CPU build in its own environment (`sapo vllm install`),
driven by the node's backend, on a tiny random model built offline.

The tests that need the engine are in the slow suite (`pytest -m slow`), and run where the
vLLM environment exists (CI makes it; see .ci/run); elsewhere they say why they are
skipped. One engine serves the module: it takes 20-30 s to start on two cores.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from flows.cli.vllm import BREAKS_IMPORT, CPU_TORCH, CPU_VLLM, install_steps
from sapo_core.config import GenerationConfig, NodeConfig, VLLMConfig
from sapo_core.policy.vllm_backend import (
    VLLMBackend,
    VLLMUnavailable,
    default_env,
    kv_cache_bytes,
    worker_python,
)
from tests.tiny_models import build_tiny_model

PYTHON = Path(os.environ.get("SAPO_VLLM_PYTHON", default_env() / "bin" / "python"))
needs_vllm = pytest.mark.skipif(
    not PYTHON.is_file(), reason=f"no vLLM environment at {PYTHON}: `sapo vllm install`"
)


def test_a_node_without_the_vllm_environment_is_told_the_command_that_makes_it(
    tmp_path: Path,
) -> None:
    with pytest.raises(VLLMUnavailable, match=r"sapo vllm install"):
        worker_python(VLLMConfig(python=str(tmp_path / "nowhere" / "python")))


def test_the_cpu_install_pins_the_cpu_builds_and_drops_what_breaks_the_import() -> None:
    steps = install_steps(Path("/envs/v"), gpu=False, python="python3")
    assert steps[0] == ["python3", "-m", "venv", "/envs/v"]
    assert [s[-1] for s in steps[1:3]] == [CPU_TORCH, CPU_VLLM]  # torch first: the CPU one
    assert steps[3][-len(BREAKS_IMPORT) :] == list(BREAKS_IMPORT)
    assert install_steps(Path("/envs/v"), gpu=True)[1][-1] == "vllm"


def test_the_kv_cache_holds_one_generation_call_not_the_machine() -> None:
    config = type(
        "C", (), {"num_hidden_layers": 30, "num_key_value_heads": 3, "num_attention_heads": 9,
                  "hidden_size": 576}
    )()  # fmt: skip
    # SmolLM2-135M: 2 (keys, values) x 30 layers x 3 heads x 64 dims x 2 bytes per token
    per_token = 2 * 30 * 3 * 64 * 2
    assert kv_cache_bytes(config, 32, 2048, 2) == per_token * 32 * 2048  # 1.41 GiB
    assert kv_cache_bytes(config, 1, 64, 2) == 64 * 2**20  # never below 64 MiB


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head size 64: what vLLM's CPU attention kernels take
    return build_tiny_model(tmp_path_factory.mktemp("tiny-vllm"), hidden=256)


@pytest.fixture(scope="module")
def served(tiny_dir: Path) -> Any:
    from sapo_core.policy.loading import load_policy

    policy = load_policy(str(tiny_dir))
    generation = GenerationConfig(
        backend="vllm",
        completions_per_question=3,
        max_new_tokens=12,
        batch_size=8,
        vllm=VLLMConfig(python=str(PYTHON), max_model_len=256, dtype="float32"),
    )
    backend = VLLMBackend(policy, generation)
    yield policy, generation, backend
    backend.close()


def _prompts(policy: Any) -> list[list[int]]:
    tok = policy.tokenizer
    return [
        tok(t, add_special_tokens=False)["input_ids"] for t in ("What is 2+2?", "Name a colour")
    ]


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_vllm_samples_groups_of_completions_by_the_nodes_rules(served: Any) -> None:
    policy, generation, backend = served
    groups = backend.generate(_prompts(policy), generation, seed=11)
    assert [len(g) for g in groups] == [3, 3]
    for completion in (c for g in groups for c in g):
        assert 1 <= len(completion.token_ids) <= 12
        assert len(completion.logprobs) == len(completion.token_ids)
        ends_with_stop = completion.token_ids[-1] in backend.stop_ids
        assert completion.finished == ends_with_stop
        assert completion.finished or len(completion.token_ids) == 12
        assert all(lp <= 1e-6 for lp in completion.logprobs)
    again = backend.generate(_prompts(policy), generation, seed=11)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    other = backend.generate(_prompts(policy), generation, seed=12)
    assert [[c.token_ids for c in g] for g in other] != [[c.token_ids for c in g] for g in groups]
    # two questions never share their draws (one seed each)
    same = backend.generate([_prompts(policy)[0]] * 2, generation, seed=11)
    assert [c.token_ids for c in same[0]] != [c.token_ids for c in same[1]]


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_updated_weights_reach_the_engine_in_place(served: Any, tiny_dir: Path) -> None:
    policy, generation, backend = served
    before = backend.generate(_prompts(policy), generation, seed=3)
    engine = backend._proc
    norm = policy.model.model.norm.weight
    saved = norm.detach().clone()
    try:
        with torch.no_grad():
            norm.zero_()  # logits all zero: every token has probability 1 / vocabulary
        backend.weights_changed()
        after = backend.generate(_prompts(policy), generation, seed=3)
    finally:
        with torch.no_grad():
            norm.copy_(saved)
        backend.weights_changed()
    uniform = -math.log(policy.model.config.vocab_size)
    assert backend._proc is engine  # reloaded in place, not a new engine
    sampled = [lp for g in after for c in g for lp in c.logprobs if c.token_ids]
    assert sampled and all(abs(lp - uniform) < 1e-3 for lp in sampled[:5])
    assert any(abs(lp - uniform) > 0.1 for g in before for c in g for lp in c.logprobs)


def _trainer_logprobs(policy: Any, prompt: list[int], completions: list[Any]) -> list[list[float]]:
    """The trainer's own log-probs of the sampled tokens (its plain forward)."""
    from sapo_core.grpo.logprobs import plain_logprobs
    from sapo_core.grpo.segments import Segment

    ids = [list(c.token_ids) for c in completions]
    seg = Segment(prompt, ids, [0.0] * len(ids), [None] * len(ids))
    with torch.no_grad():
        logprobs, _ = plain_logprobs(policy.model, [seg], 1.0, int(policy.tokenizer.pad_token_id))
    return [logprobs[i, : len(row)].tolist() for i, row in enumerate(ids)]


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_the_engines_logprobs_move_with_the_trainers_after_an_update(served: Any) -> None:
    """A completion's log-probs under vLLM equal the trainer's (both fp32 here), before and
    after the trainer's weights move: the engine serves the weights just trained."""
    policy, generation, backend = served
    prompt = _prompts(policy)[0]
    saved = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    try:
        for step in range(2):
            (group,) = backend.generate([prompt], generation, seed=21)
            trainer = _trainer_logprobs(policy, prompt, group)
            for completion, mine in zip(group, trainer, strict=True):
                # the stop token vLLM returns carries its log-prob too
                assert completion.logprobs == pytest.approx(mine, abs=2e-3)
            if step == 0:
                with torch.no_grad():  # an update's worth of movement, everywhere
                    for param in policy.model.parameters():
                        param.add_(torch.randn_like(param) * 0.05)
                backend.weights_changed()
                moved = _trainer_logprobs(policy, prompt, group)
                pairs = zip(trainer, moved, strict=True)
                assert any(abs(a - b) > 1e-2 for x, y in pairs for a, b in zip(x, y, strict=True))
    finally:
        policy.model.load_state_dict(saved)
        backend.weights_changed()


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_a_worker_that_dies_is_started_again_with_the_current_weights(served: Any) -> None:
    policy, generation, backend = served
    first = backend.generate(_prompts(policy), generation, seed=5)
    backend._proc.kill()
    backend._proc.wait()
    again = backend.generate(_prompts(policy), generation, seed=5)
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in first]


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_the_engine_takes_what_one_call_needs_not_the_machine(served: Any) -> None:
    import psutil

    policy, generation, backend = served
    backend.generate(_prompts(policy), generation, seed=1)
    rss = psutil.Process(backend._proc.pid).memory_info().rss
    assert backend.kv_bytes == 64 * 2**20  # 8 sequences of 256 tokens of a tiny model
    assert rss < 3 * 2**30, f"{rss / 2**30:.2f} GiB"  # vLLM's own default took 16.75 GiB


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
def test_a_learner_on_vllm_trains_on_its_own_samples_with_the_trainers_logprobs(
    tiny_dir: Path,
) -> None:
    from sapo_core.config import GRPOConfig, TaskConfig, TaskSpec
    from sapo_core.learner import Learner

    config = NodeConfig(
        node_id="v",
        model=str(tiny_dir),
        tasks=TaskConfig(specs=(TaskSpec(name="chain_sum", config={"max_terms": 2}),)),
        generation=GenerationConfig(
            backend="vllm", completions_per_question=3, max_new_tokens=6, batch_size=6,
            vllm=VLLMConfig(python=str(PYTHON), max_model_len=256, dtype="float32"),
        ),
        grpo=GRPOConfig(drop_zero_variance=False, micro_batch_size=4),
    )  # fmt: skip
    learner = Learner(config)
    try:
        assert isinstance(learner.backend, VLLMBackend)
        generated = learner.generate(0)
        assert generated.groups and all(len(g.rollouts) == 3 for g in generated.groups)
        chosen, flagged = learner.select(0, generated.groups, [])
        segments, _ = learner.encode(chosen.trained)
        # vLLM's log-probs are never divided by: the update takes the trainer's own
        assert all(lp is None for seg in segments for lp in seg.behaviour_logprobs)
        report = learner.update(0, chosen, flagged)
        assert learner.policy_version == 1 and report.update["ratio_mean"] == pytest.approx(1.0)
        assert learner.backend._stale  # the next generation reloads the trained weights
        assert learner.generate(1).groups
        assert not learner.backend._stale
    finally:
        learner.close()


def test_the_engine_is_sized_for_the_smallest_lora_rank_that_holds_the_adapter() -> None:
    from sapo_core.policy.vllm_backend import engine_lora_rank

    assert [engine_lora_rank(r) for r in (1, 4, 8, 9, 16, 17, 512)] == [1, 8, 8, 16, 16, 32, 512]
    with pytest.raises(ValueError, match="above vLLM's largest"):
        engine_lora_rank(513)


@pytest.mark.slow  # each starts or drives an engine: the slow suite
@needs_vllm
@pytest.mark.parametrize("sync", ["lora", "merged"])
def test_an_adapter_node_samples_its_adapted_policy_before_and_after_an_update(
    tiny_dir: Path, sync: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's log-probs are the adapted model's (the trainer's, with the adapter on),
    and move with the adapter after an update, whether it serves the adapter or the merged
    weights (written in several shards, as a large model's are); the base's files are
    linked, never copied, when it serves the adapter."""
    from sapo_core.config import AdapterConfig
    from sapo_core.policy import adapter, merged_weights
    from sapo_core.policy.loading import load_policy

    monkeypatch.setattr(merged_weights, "DEFAULT_SHARD_BYTES", 40_000)  # the tiny model: 3+

    policy = load_policy(str(tiny_dir))
    policy.model = adapter.attach(policy.model, AdapterConfig(kind="lora", rank=4, alpha=8))

    def nudge(seed: int) -> None:  # a trained adapter: B != 0
        with torch.no_grad():
            for name, param in policy.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))

    nudge(0)
    generation = GenerationConfig(
        backend="vllm", completions_per_question=3, max_new_tokens=12, batch_size=8,
        vllm=VLLMConfig(
            python=str(PYTHON), max_model_len=256, dtype="float32", adapter_sync=sync
        ),
    )  # fmt: skip
    backend = VLLMBackend(policy, generation)
    prompt = _prompts(policy)[0]
    try:
        assert backend.serves_adapter == (sync == "lora")
        seen = []
        for update in (1, 2):
            (group,) = backend.generate([prompt], generation, seed=21)
            trainer = _trainer_logprobs(policy, prompt, group)
            for completion, mine in zip(group, trainer, strict=True):
                assert completion.logprobs == pytest.approx(mine, abs=2e-3)
            with adapter.base_only(policy.model):
                base = _trainer_logprobs(policy, prompt, group)
            pairs = zip(trainer, base, strict=True)
            moved = [abs(a - b) for x, y in pairs for a, b in zip(x, y, strict=True)]
            assert max(moved) > 1e-2  # the adapter is applied
            seen.append([c.token_ids for c in group])
            nudge(update)
            backend.weights_changed()
        assert seen[0] != seen[1]
        weights = sorted(backend._folder.glob("*.safetensors"))
        if sync == "lora":
            assert weights and all(w.is_symlink() for w in weights)
            assert (backend._folder / "adapter" / "adapter_model.safetensors").is_file()
        else:
            assert len(weights) > 2 and not any(w.is_symlink() for w in weights)
            assert (backend._folder / merged_weights.INDEX).is_file()
    finally:
        backend.close()
