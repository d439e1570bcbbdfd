"""One GRPO update on fixed inputs, timed: an A/B of a code change to the update.

`vs_trl.py`'s rounds sample different completions as soon as two builds' weights differ in
their last bits, so their update times compare different work. Here the work is fixed: the
bundled model under vs_trl's short workload (its node config), 8 groups of 4 completions
behind a 45-token prompt, lengths from a seeded RNG (about 1,400 tokens, as vs_trl's rounds
sample), random token ids, fixed advantages. Every update starts from the same weights and a
fresh optimizer, as a node's first round does. Run it from each checkout in turn
(PYTHONPATH=<checkout>: the script only needs the update's long-standing API), alternating,
on an idle machine; the first update of a process is a warm-up and is left out:

    PYTHONPATH=/path/to/old python benchmarks/update_ab.py --repeats 4
    PYTHONPATH=. python benchmarks/update_ab.py --repeats 4
    PYTHONPATH=. python benchmarks/update_ab.py --repeats 4 --grpo plan=plain
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time

import torch

# Nothing of the checkout is imported at module level (no sibling script either: vs_trl.py
# puts its own checkout first on sys.path), so PYTHONPATH decides which build is measured.


def segments(seed: int, groups: int, completions: int, vocab: int) -> list:
    from sapo_core.grpo.segments import Segment

    rng = random.Random(seed)
    prompt = [rng.randrange(vocab) for _ in range(45)]
    out = []
    for _ in range(groups):
        lengths = [rng.randint(10, 80) for _ in range(completions)]
        ids = [[rng.randrange(vocab) for _ in range(n)] for n in lengths]
        advantages = [rng.uniform(-1.0, 1.0) for _ in range(completions)]
        out.append(Segment(list(prompt), ids, advantages, [None] * completions))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=4, help="timed updates, after one warm-up")
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--completions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--grpo",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a GRPOConfig field, its value read as the command line's --set reads it",
    )
    args = p.parse_args()
    from flows.env import apply_offline_defaults
    from flows.yaml_config import ConfigError, apply_overrides

    try:
        grpo = apply_overrides({}, args.grpo)
    except ConfigError as exc:
        p.error(str(exc))

    apply_offline_defaults()
    import sapo_core
    from sapo_core.config import NodeConfig
    from sapo_core.grpo.optimizer import make_optimizer
    from sapo_core.grpo.update import grpo_update
    from sapo_core.learner import Learner

    torch.manual_seed(args.seed)
    try:
        config = NodeConfig.model_validate({"node_id": "bench", "seed": args.seed, "grpo": grpo})
    except ValueError as exc:  # pydantic's ValidationError: name the field and the problem
        p.error("--grpo: " + " ".join(line.strip() for line in str(exc).splitlines()[1:3]))
    learner = Learner(config)
    model = learner.policy.model
    start = {k: v.clone() for k, v in model.state_dict().items()}
    work = segments(args.seed, args.groups, args.completions, model.config.vocab_size)
    tokens = sum(len(ids) for s in work for ids in s.completion_ids)
    seconds, losses = [], []
    for _ in range(args.repeats + 1):
        model.load_state_dict(start)
        optimizer = make_optimizer(model, config.grpo)
        began = time.perf_counter()
        result = grpo_update(
            model, optimizer, work, config.grpo, temperature=1.0,
            pad_id=learner.policy.tokenizer.pad_token_id,
            max_completion_length=config.generation.max_new_tokens,
        )  # fmt: skip
        seconds.append(time.perf_counter() - began)
        losses.append(result.metrics["loss"])
    timed = seconds[1:]
    print(
        json.dumps(
            {
                "tokens": tokens,
                "warmup_s": round(seconds[0], 2),
                "seconds": [round(s, 2) for s in timed],
                "median_s": round(statistics.median(timed), 2),
                "s_per_1k_tokens": round(1000 * statistics.median(timed) / tokens, 2),
                "loss": losses[-1],
                "peak_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
                "grpo": grpo,
                "checkout": sapo_core.__file__,
            }
        )
    )


if __name__ == "__main__":
    main()
