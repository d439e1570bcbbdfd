"""Where a node's round goes: torch.profiler's top operators for generation and update.

The workload of `vs_trl.py` (one node, the bundled model, 8 questions x 4 completions x
<= 128 new tokens). One warm-up round, then one profiled round; prints the top operators by
self CPU time for each phase, the phase's wall time, and the process's RSS after each phase.

    python benchmarks/profile_round.py --prompt long
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vs_trl import peak_rss_gb, sapo_config


def rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**30


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--prompt", choices=["short", "long"], default="long")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from torch.profiler import ProfilerActivity, profile

    from sapo_core.learner import Learner

    learner = Learner(sapo_config(args.prompt, args.seed))
    print(f"loaded: rss {rss_gb():.2f} GB")
    warm = learner.generate(0)
    learner.train_round(0, warm)
    print(f"warm-up round: rss {rss_gb():.2f} GB, peak {peak_rss_gb():.2f} GB")
    for phase in ("generation", "update"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            if phase == "generation":
                generated = learner.generate(1)
            else:
                learner.train_round(1, generated)
            seconds = time.perf_counter() - started
        extra = f", {generated.tokens} tokens" if phase == "generation" else ""
        print(
            f"\n== {phase}: {seconds:.1f} s{extra}; rss {rss_gb():.2f} GB, "
            f"peak {peak_rss_gb():.2f} GB"
        )
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.top)
        print(table)


if __name__ == "__main__":
    main()
