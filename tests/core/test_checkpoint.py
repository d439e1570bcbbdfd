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
from sapo_core.learner import Generated, Learner
from sapo_core.node_state import RewardTotals
from sapo_core.policy.loading import load_model, load_policy
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


def own(*groups: Group) -> Generated:
    """Hand-made own groups, as `Learner.generate` returns its own."""
    return Generated(list(groups), 0.0, 0)


def test_newest_only_stale_temporaries_removed_model_files_listed(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    me = learner(tiny_model_dir)
    me.totals = RewardTotals(0.5, 0.25)
    first = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))
    stale = first.path.parent / ".tmp-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    me.policy_version = 3
    me.totals = RewardTotals(1.5, 0.75)
    second = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 2))
    kept = sorted(p.name for p in second.path.parent.iterdir())
    assert kept == ["round-000002"]  # the old one and the interrupted one are gone
    assert checkpoint.latest(tmp_path, "n") == second
    assert (second.next_round, second.policy_version) == (2, 3)
    assert second.totals == RewardTotals(1.5, 0.75)
    names = {p.name for p in checkpoint.model_files(second.path)}
    assert "model.safetensors" in names and "config.json" in names
    assert not names & {"optimizer.pt", "rng.pt", "state.json"}
    # A directory without state.json (a save cut short before its last write) is ignored.
    (second.path.parent / "round-000009").mkdir()
    assert checkpoint.latest(tmp_path, "n") == second


def test_restore_gives_back_weights_optimizer_and_counters(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    from sapo_core.reputation import PeerEvidence

    me = learner(tiny_model_dir)
    made = me.generate(0)
    me.train_round(0, made)
    me.reputation.update({"p": PeerEvidence(rows=6, failed=1)})
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))
    again = Learner.from_checkpoint(me.config, saved.path, checkpoint.read_state(saved))
    for a, b in zip(me.policy.model.parameters(), again.policy.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert again.policy_version == me.policy_version
    assert me.policy_version == 1
    assert again.totals == me.totals and again.totals is not me.totals
    assert again.totals.cumulative_own_reward == made.own_reward
    assert again.reputation.peers == me.reputation.peers and again.reputation.peers["p"].judged == 6
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
    report = me.train_round(0, own(Group(group.group_id, "local", (right, *group.rollouts[1:]))))
    assert report.training_reward == 0.5 and report.groups_trained == 1
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))

    again = Learner.from_checkpoint(
        config, saved.path, checkpoint.read_state(saved), id_prefix="s."
    )
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
    me.train_round(0, me.generate(0))
    me.totals = RewardTotals(0.5, 0.25)
    release = threading.Event()
    real = checkpoint.write

    def held(pending: Any) -> Any:  # the thread reads nothing until released
        release.wait(30)
        return real(pending)

    monkeypatch.setattr(checkpoint, "write", held)
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    writer = checkpoint.Writer()
    pending = writer.start(checkpoint.capture(tmp_path, "n", me, 1, {"k": "v"}))
    assert checkpoint.latest(tmp_path, "n") is None
    torch.manual_seed(1234)  # what the caller does next must not leak into the checkpoint
    random.seed(1234)
    me.totals.add(own_reward=1.0, training_reward=1.0)
    release.set()
    written = writer.wait()
    assert written == pending and writer.wait() is None
    assert written.totals == RewardTotals(0.5, 0.25)
    assert checkpoint.latest(tmp_path, "n") == written
    rng = torch.load(written.path / "rng.pt", weights_only=False)
    assert torch.equal(rng["torch"], torch_rng) and rng["python"] == python_rng
    monkeypatch.setattr(checkpoint, "write", real)
    me.totals = RewardTotals(0.5, 0.25)
    again = checkpoint.write(checkpoint.capture(tmp_path / "sync", "n", me, 1))
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
    me.train_round(1, me.generate(1))
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
    again = Learner.from_checkpoint(me.config, first.path, checkpoint.read_state(first))
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
    me.train_round(0, own(trained))
    state = me.optimizer.state_dict()["state"]
    named = [n for n, p in me.policy.model.named_parameters() if p.requires_grad]
    assert len(state) == len(named) and all("lora_" in n for n in named)
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 1))
    names = sorted(p.name for p in checkpoint.model_files(saved.path))
    assert "adapter_model.safetensors" in names and "model.safetensors" not in names
    adapter_bytes = (saved.path / "adapter_model.safetensors").stat().st_size
    full_bytes = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    assert adapter_bytes < full_bytes / 4

    again = Learner.from_checkpoint(config, saved.path, checkpoint.read_state(saved))
    assert again.policy.model_id == config.model and again.ref_model is None
    for (name, a), b in zip(
        me.policy.model.named_parameters(), again.policy.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
        assert a.requires_grad == b.requires_grad, name
    # The next step, from both: bit for bit the same weights.
    me.train_round(1, own(trained))
    again.train_round(1, own(trained))
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


def test_a_checkpoint_from_before_the_learner_held_its_reputation_resumes_the_old_file(
    tmp_path: Path, tiny_model_dir: Any
) -> None:
    """Older nodes kept their reputation in <node>/reputation.json, with the state before
    each round past their checkpoint: a resume takes the one of the round it resumes at."""
    me = learner(tiny_model_dir)
    saved = checkpoint.write(checkpoint.capture(tmp_path, "n", me, 2))
    state = json.loads((saved.path / "state.json").read_text())
    del state["reputation"]
    (saved.path / "state.json").write_text(json.dumps(state))
    saved = checkpoint.latest(tmp_path, "n")
    assert saved is not None and saved.reputation is None
    record = {"judged": 8, "rows": 8.0, "bad": 1.0}
    later = {"judged": 12, "rows": 12.0, "bad": 1.0}
    old = {
        "version": 2,
        "peers": {"p": later},
        "through_round": 2,
        "before": {"2": {"version": 2, "peers": {"p": record}}},
    }
    (checkpoint.node_dir(tmp_path, "n") / "reputation.json").write_text(json.dumps(old))
    again = Learner.from_checkpoint(me.config, saved.path, checkpoint.read_state(saved))
    assert again.reputation.peers["p"].judged == 8  # round 2's verdicts are not counted yet
    (checkpoint.node_dir(tmp_path, "n") / "reputation.json").unlink()
    assert (
        Learner.from_checkpoint(
            me.config, saved.path, checkpoint.read_state(saved)
        ).reputation.peers
        == {}
    )


@dataclasses.dataclass
class _RunsCode:
    """What a hostile pickle carries: unpickling it calls a function of the attacker's."""

    target: str

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        import os

        return (os.mkdir, (self.target,))


@pytest.mark.parametrize("name", [checkpoint.RNG, checkpoint.OPTIMIZER])
def test_a_training_state_file_that_would_run_code_is_refused_not_loaded(
    tmp_path: Path, tiny_model_dir: Any, name: str
) -> None:
    """A checkpoint home another party can write (or a tampered disk) holds a pickle that
    runs code when loaded: it is refused with the file's name, and nothing of it runs."""
    ran = tmp_path / "the-pickle-ran"
    me = learner(tiny_model_dir)
    saved = checkpoint.write(checkpoint.capture(tmp_path / "checkpoints", "n", me, 1))
    torch.save({"state": _RunsCode(str(ran))}, saved.path / name)
    with pytest.raises(checkpoint.NotResumable, match=rf"{name} holds more than tensors"):
        checkpoint.read_state(saved)
    assert not ran.exists()
