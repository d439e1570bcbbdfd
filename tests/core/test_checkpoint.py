"""Checkpoints: atomic, only the newest kept, interrupted saves cleaned, resume exact."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from flows.node import checkpoint
from sapo_core.config import GenerationConfig, GRPOConfig, NodeConfig, TaskConfig, TaskSpec
from sapo_core.learner import Learner
from sapo_core.policy.loading import Policy, load_model, load_policy
from sapo_core.rollouts import Group


def node_config(model_dir: Path, **grpo: Any) -> NodeConfig:
    return NodeConfig(
        node_id="n",
        model=str(model_dir),
        local_groups=1,
        tasks=TaskConfig(specs=[TaskSpec(name="chain_sum")]),
        generation=GenerationConfig(completions_per_question=2, max_new_tokens=3),
        # a random model earns 0: step anyway
        grpo=GRPOConfig(drop_zero_variance=False, **grpo),
    )


def learner(model_dir: Path) -> Learner:
    return Learner(node_config(model_dir))


def test_newest_only_stale_temporaries_removed_model_files_listed(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    me = learner(tiny_model_dir)
    first = checkpoint.write(
        checkpoint.capture(tmp_path, "n", me, 1, checkpoint.RewardTotals(0.5, 0.25))
    )
    stale = first.path.parent / ".tmp-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    me.policy_version = 3
    second = checkpoint.write(
        checkpoint.capture(tmp_path, "n", me, 2, checkpoint.RewardTotals(1.5, 0.75))
    )
    kept = sorted(p.name for p in second.path.parent.iterdir())
    assert kept == ["round-000002"]  # the old one and the interrupted one are gone
    assert checkpoint.latest(tmp_path, "n") == second
    assert (second.next_round, second.policy_version) == (2, 3)
    assert second.totals == checkpoint.RewardTotals(1.5, 0.75)
    names = {p.name for p in checkpoint.model_files(second.path)}
    assert "model.safetensors" in names and "config.json" in names
    assert not names & {"optimizer.pt", "rng.pt", "state.json"}
    # A directory without state.json (a save cut short before its last write) is ignored.
    (second.path.parent / "round-000009").mkdir()
    assert checkpoint.latest(tmp_path, "n") == second


def test_restore_gives_back_weights_optimizer_and_counters(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    me = learner(tiny_model_dir)
    made = me.generate(0)
    me.train(0, made.groups)
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))
    loaded = load_policy(str(saved.path))
    again = Learner(me.config, policy=Policy(loaded.model, loaded.tokenizer, model_id="x"))
    checkpoint.restore_into(again, saved)
    for a, b in zip(me.policy.model.parameters(), again.policy.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert again.policy_version == me.policy_version
    assert me.policy_version == 1
    ours, theirs = me.optimizer.state_dict()["state"], again.optimizer.state_dict()["state"]
    assert ours.keys() == theirs.keys() and len(ours) > 0
    for key in ours:
        assert torch.equal(ours[key]["exp_avg"], theirs[key]["exp_avg"])


def test_resume_keeps_the_initial_weights_as_kl_reference(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    config = node_config(tiny_model_dir, beta=0.1, learning_rate=1e-2)
    me = Learner(config)
    [group] = me.generate(0).groups
    # One right answer in the group gives non-zero advantages, so the step moves the weights
    # (at the reference the KL term alone has zero gradient).
    right = dataclasses.replace(  # with the verdict generate would have given it
        group.rollouts[0], completion=f"<answer>{group.question.answer}</answer>", reward=1.0
    )
    report = me.train(0, [Group(group.group_id, "local", (right, *group.rollouts[1:]))])
    assert report.training_reward == 0.5 and report.groups_trained == 1
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))

    again = Learner.from_checkpoint(config, saved.path, id_prefix="s.")
    checkpoint.restore_into(again, saved)
    initial = load_model(str(tiny_model_dir))
    names = [name for name, _ in initial.named_parameters()]
    pairs = zip(
        initial.parameters(),
        again.ref_model.parameters(),
        me.policy.model.parameters(),
        again.policy.model.parameters(),
        strict=True,
    )
    moved = []
    for name, (start, reference, trained, resumed) in zip(names, pairs, strict=True):
        assert torch.equal(reference, start), name
        assert torch.equal(resumed, trained), name
        assert not reference.requires_grad
        moved.append(not torch.equal(trained, start))
    assert all(moved)  # every parameter trained away from the reference
    assert again.policy.model_id == config.model and again.id_prefix == "s."
    assert again.policy_version == 1
    # The learner that trained still holds the initial weights as its reference too.
    for start, reference in zip(initial.parameters(), me.ref_model.parameters(), strict=True):
        assert torch.equal(reference, start)


def test_a_passed_policy_is_not_the_reference_unless_passed_as_one(tiny_model_dir: Any) -> None:
    config = node_config(tiny_model_dir, beta=0.1)
    other = load_policy(str(tiny_model_dir))
    with torch.no_grad():
        for p in other.model.parameters():
            p.add_(1.0)  # stands for a checkpoint's trained weights
    initial = load_model(str(tiny_model_dir))
    resumed = Learner(config, policy=other)
    for start, reference in zip(initial.parameters(), resumed.ref_model.parameters(), strict=True):
        assert torch.equal(reference, start)
    chosen = load_model(str(tiny_model_dir))
    given = Learner(config, policy=other, reference=chosen)
    assert given.ref_model is chosen and not any(p.requires_grad for p in chosen.parameters())
    assert Learner(node_config(tiny_model_dir), policy=other).ref_model is None  # beta 0


def test_a_background_write_is_the_checkpoint_a_save_makes_with_state_captured_at_start(
    tmp_path: Path, tiny_model_dir: Any, monkeypatch: Any
) -> None:
    import random
    import threading

    me = learner(tiny_model_dir)
    me.train(0, me.generate(0).groups)
    release = threading.Event()
    real = checkpoint.write

    def held(pending: Any) -> Any:  # the thread reads nothing until released
        release.wait(30)
        return real(pending)

    monkeypatch.setattr(checkpoint, "write", held)
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    writer = checkpoint.Writer()
    totals = checkpoint.RewardTotals(0.5, 0.25)
    pending = writer.start(checkpoint.capture(tmp_path, "n", me, 1, totals, {"k": "v"}))
    assert writer.busy and checkpoint.latest(tmp_path, "n") is None
    torch.manual_seed(1234)  # what the caller does next must not leak into the checkpoint
    random.seed(1234)
    release.set()
    written = writer.wait()
    assert written == pending and not writer.busy and writer.wait() is None
    assert checkpoint.latest(tmp_path, "n") == written
    rng = torch.load(written.path / "rng.pt", weights_only=False)
    assert torch.equal(rng["torch"], torch_rng) and rng["python"] == python_rng
    monkeypatch.setattr(checkpoint, "write", real)
    again = checkpoint.write(
        checkpoint.capture(tmp_path / "sync", "n", me, 1, checkpoint.RewardTotals(0.5, 0.25))
    )
    for name in ("model.safetensors", "optimizer.pt", "state.json"):
        ours, theirs = (written.path / name).read_bytes(), (again.path / name).read_bytes()
        if name == "state.json":
            assert json.loads(ours) == {**json.loads(theirs), "config": {"k": "v"}}
        else:
            assert ours == theirs, name


def test_a_write_that_fails_raises_from_wait_and_the_previous_checkpoint_stays_usable(
    tmp_path: Path, tiny_model_dir: Any, monkeypatch: Any
) -> None:
    me = learner(tiny_model_dir)
    writer = checkpoint.Writer()
    writer.start(checkpoint.capture(tmp_path, "n", me, 1))
    first = writer.wait()
    assert first is not None
    me.train(1, me.generate(1).groups)
    real_save = torch.save

    def full_disk(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path).endswith("optimizer.pt"):
            Path(path).write_bytes(b"half an optimizer")
            raise OSError(28, "No space left on device")
        real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    writer.start(checkpoint.capture(tmp_path, "n", me, 2))
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    monkeypatch.setattr(torch, "save", real_save)
    assert checkpoint.latest(tmp_path, "n") == first  # the half-written one is not taken
    loaded = load_policy(str(first.path))
    again = Learner(me.config, policy=Policy(loaded.model, loaded.tokenizer, model_id="x"))
    checkpoint.restore_into(again, first)
    assert again.policy_version == 0
    writer.start(
        checkpoint.capture(tmp_path, "n", me, 2)
    )  # the next save clears the interrupted folder
    assert writer.wait() is not None
    assert sorted(p.name for p in first.path.parent.iterdir()) == ["round-000002"]


@pytest.mark.parametrize("base_precision", ["fp32", "bf16"])
def test_an_adapter_checkpoint_holds_the_adapter_and_resumes_bit_for_bit(
    tmp_path: Path, tiny_model_dir: Any, base_precision: str
) -> None:
    """LoRA (grpo.adapter): the checkpoint is the adapter and its Adam moments only; the
    resumed learner takes the next step exactly as the one that never stopped; the KL
    reference is the base with the adapter off, with no second model kept. Under a bf16
    base the adapter and its Adam moments stay fp32."""
    from sapo_core.config import AdapterConfig
    from sapo_core.grpo.logprobs import plain_logprobs
    from sapo_core.grpo.segments import Segment
    from sapo_core.policy import adapter

    lora = AdapterConfig(kind="lora", rank=4, alpha=8, base_precision=base_precision)
    config = node_config(tiny_model_dir, beta=0.1, learning_rate=1e-2, adapter=lora)
    me = Learner(config)
    assert adapter.is_adapted(me.policy.model) and me.ref_model is None
    dtype = torch.bfloat16 if base_precision == "bf16" else torch.float32
    dtypes = {n: p.dtype for n, p in me.policy.model.named_parameters()}
    assert {d for n, d in dtypes.items() if "lora_" not in n} == {dtype}
    assert {d for n, d in dtypes.items() if "lora_" in n} == {torch.float32}
    [group] = me.generate(0).groups
    right = dataclasses.replace(  # with the verdict generate would have given it
        group.rollouts[0], completion=f"<answer>{group.question.answer}</answer>", reward=1.0
    )
    trained = Group(group.group_id, "local", (right, *group.rollouts[1:]))
    me.train(0, [trained])
    state = me.optimizer.state_dict()["state"]
    named = [n for n, p in me.policy.model.named_parameters() if p.requires_grad]
    assert len(state) == len(named) and all("lora_" in n for n in named)
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))
    names = sorted(p.name for p in checkpoint.model_files(saved.path))
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names
    adapter_bytes = (saved.path / "adapter_model.safetensors").stat().st_size
    full_bytes = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    assert adapter_bytes < full_bytes / 4

    again = Learner.from_checkpoint(config, saved.path)
    checkpoint.restore_into(again, saved)
    assert again.policy.model_id == config.model and again.ref_model is None
    for (name, a), b in zip(
        me.policy.model.named_parameters(), again.policy.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
        assert a.requires_grad == b.requires_grad, name
    # The next step, from both: bit for bit the same weights.
    me.train(1, [trained])
    again.train(1, [trained])
    for (name, a), b in zip(
        me.policy.model.named_parameters(), again.policy.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    # The reference: the base weights, untouched by two steps of training.
    segment = [Segment([5, 6, 7], [[8, 9, 10]], [1.0], [None])]
    base = load_model(str(tiny_model_dir), dtype).eval()
    with torch.no_grad():
        expected, _ = plain_logprobs(base, segment, 1.0, 2)
        again._reference_logprobs(segment, 1.0, 2)
        now, _ = plain_logprobs(again.policy.model.eval(), segment, 1.0, 2)
    assert segment[0].ref_logprobs is not None
    got = torch.tensor(segment[0].ref_logprobs[0])
    assert torch.allclose(got, expected[0], atol=1e-5)
    assert not torch.allclose(now, expected, atol=1e-4)  # while the policy has moved
