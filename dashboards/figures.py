"""The report's figures (matplotlib, no display needed), one PNG each, one panel or line
per swarm.

Inputs are the frames of the report's SQL files; nothing here reads the ledger.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from ledger.schema import sharing_label

MOVING_AVERAGE = 5  # rounds


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FEW_POINTS = 12
"""A line of this many points or fewer shows each as a marker: one round's point is visible,
and a short run's rounds can be counted."""


def _integer_rounds(ax: Any) -> None:
    """Whole rounds on x; a single round is centred with one tick (matplotlib would give a
    zero-width range ticked at fractions of a round)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    low, high = _data_rounds(ax)
    if low is not None and high is not None and high - low < 1:
        ax.set_xlim(low - 0.5, high + 0.5)
        ax.set_xticks([round(low)])


def _data_rounds(ax: Any) -> tuple[float | None, float | None]:
    """The smallest and largest round any line of ``ax`` draws (None, None: no line)."""
    xs = [float(x) for line in ax.get_lines() for x in line.get_xdata()]
    return (min(xs), max(xs)) if xs else (None, None)


def _points(n: int) -> dict[str, Any]:
    """Line style for ``n`` points: markers for few (see FEW_POINTS), a plain line for many."""
    if n > FEW_POINTS:
        return {}
    return {"marker": "o", "markersize": 6.0 if n <= 2 else 3.5}  # a lone point stands out


def smoothing_window(rounds: int) -> int:
    """The moving average's window for a run of ``rounds``: MOVING_AVERAGE, or all of a
    shorter run (a 3-round figure says "3-round", not "5-round")."""
    return max(1, min(MOVING_AVERAGE, rounds))


def _round_axes(ax: Any, ylabel: str, title: str, *, unit_range: bool = False) -> None:
    """Rounds on x, a grid and a legend: the frame of the line figures."""
    _integer_rounds(ax)
    ax.set_ylabel(ylabel)
    if unit_range:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def label(row: dict[str, Any]) -> str:
    """A swarm's name in figures: its id, and its sharing configuration where known."""
    i, j = row.get("local_groups"), row.get("external_groups")
    if i is None or j is None:
        return str(row["swarm_id"])
    policy = row.get("policy")
    shown = f" {policy}" if j and policy not in (None, "paper") else ""
    return f"{row['swarm_id']} ({sharing_label(i, j)}{shown})"


def _swarms(summary: pl.DataFrame) -> list[dict[str, Any]]:
    """One dict per swarm, in the summary's order (sweep_summary.sql orders them)."""
    return summary.to_dicts()


def _grid(plt: Any, panels: int, width: float, height: float) -> tuple[Any, Any]:
    cols = min(panels, 4)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, axes


def moving_average(values: list[float], window: int = MOVING_AVERAGE) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def reward_panels(rewards: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Per-node reward per round with a moving average, one panel per swarm."""
    plt = _pyplot()
    swarms = _swarms(summary)
    fig, axes = _grid(plt, len(swarms), 4.2, 3.2)
    window = smoothing_window(rewards["node_round"].n_unique())
    for ax, swarm in zip(axes.flat, swarms, strict=False):
        mine = rewards.filter(pl.col("swarm_id") == swarm["swarm_id"])
        for (node,), part in mine.sort("node_round").group_by("node_id", maintain_order=True):
            x = part["node_round"].to_list()
            y = part["claimed_reward"].to_list()
            if window == 1:  # nothing to smooth: the rounds themselves, bold
                ax.plot(x, y, linewidth=1.8, label=node, **_points(len(x)))
                continue
            line = ax.plot(x, y, alpha=0.25, linewidth=0.8, **_points(len(x)))[0]
            smooth = moving_average(y, window)
            ax.plot(x, smooth, color=line.get_color(), linewidth=1.8, label=node)
        ax.set_title(label(swarm), fontsize=9)
        _integer_rounds(ax)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("reward (own completions)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    # Wrapped so that a single narrow panel shows the whole title.
    smoothed = f"\n({window}-round moving average bold)" if window > 1 else ""
    fig.suptitle(f"Reward per node and round{smoothed}")
    return _save(fig, path)


def cumulative_curves(rewards: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Cumulative reward over rounds (summed over nodes), one line per swarm; a swarm in an
    experiment shows its gain over the experiment's J = 0 baseline."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for swarm in _swarms(summary):
        per_round = (
            rewards.filter(pl.col("swarm_id") == swarm["swarm_id"])
            .group_by("node_round")
            .agg(pl.col("claimed_reward").sum())
            .sort("node_round")
        )
        gain = swarm.get("gain_over_baseline")
        tag = "" if gain is None or not swarm["external_groups"] else f" {gain:+.1%}"
        ax.plot(
            per_round["node_round"].to_list(),
            per_round["claimed_reward"].cum_sum().to_list(),
            label=label(swarm) + tag,
            linewidth=1.8,
            **_points(per_round.height),
        )
    _round_axes(ax, "cumulative claimed reward (all nodes)", "Cumulative claimed reward per swarm")
    return _save(fig, path)


def zero_variance_lines(zero: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Share of published groups whose rewards all agree, per round and swarm."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    window = smoothing_window(zero["node_round"].n_unique())
    for swarm in _swarms(summary):
        mine = zero.filter(pl.col("swarm_id") == swarm["swarm_id"]).sort("node_round")
        y = moving_average(mine["zero_variance_fraction"].to_list(), window)
        ax.plot(mine["node_round"].to_list(), y, label=label(swarm), **_points(len(y)))
    smoothed = f" ({window}-round moving average)" if window > 1 else ""
    title = f"Groups with no learning signal{smoothed}"
    _round_axes(ax, "zero-variance groups", title, unit_range=True)
    return _save(fig, path)


def peer_matrices(peers: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path | None:
    """Groups each receiver drew from each peer, one heat map per swarm that sampled any."""
    sampled = set(peers["swarm_id"].to_list())
    swarms = [s for s in _swarms(summary) if s["swarm_id"] in sampled]
    if not swarms:
        return None
    plt = _pyplot()
    fig, axes = _grid(plt, len(swarms), 3.6, 3.4)
    for ax, swarm in zip(axes.flat, swarms, strict=False):
        mine = peers.filter(pl.col("swarm_id") == swarm["swarm_id"])
        nodes = sorted(set(mine["receiver"].to_list()) | set(mine["peer"].to_list()))
        grid = [[0] * len(nodes) for _ in nodes]
        for receiver, peer, count in mine.select("receiver", "peer", "groups_drawn").rows():
            grid[nodes.index(receiver)][nodes.index(peer)] = count
        ax.imshow(grid, cmap="Blues")
        for i, row in enumerate(grid):
            for j, count in enumerate(row):
                ax.text(j, i, str(count), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(nodes)), nodes, rotation=45, fontsize=7)
        ax.set_yticks(range(len(nodes)), nodes, fontsize=7)
        ax.set_xlabel("peer (publisher)")
        ax.set_ylabel("receiver")
        ax.set_title(label(swarm), fontsize=9)
    fig.suptitle("Who sampled whom: peer groups drawn")
    return _save(fig, path)


def _per_seed_rounds(part: pl.DataFrame, column: str) -> pl.DataFrame:
    """Per seed and round: ``column``'s mean over nodes and its running sum over rounds
    (empty when the frame has no such column: a hand-made one)."""
    if column not in part.columns:
        return pl.DataFrame(schema={"seed": pl.Int64, "node_round": pl.Int64, column: pl.Float64})
    return (
        part.filter(pl.col(column).is_not_null())
        .group_by("seed", "node_round")
        .agg(pl.col(column).mean())
        .sort("node_round")
        .with_columns(pl.col(column).cum_sum().over("seed").alias("cumulative"))
    )


def _mean_line(ax: Any, frame: pl.DataFrame, column: str, **style: Any) -> Any:
    mean = frame.group_by("node_round").agg(pl.col(column).mean()).sort("node_round")
    return ax.plot(mean["node_round"], mean[column], **{**_points(mean.height), **style})[0]


def configuration_curves(
    node_rounds: pl.DataFrame, path: Path, order: list[str] | None = None
) -> Path:
    """An experiment's replicates, one line per configuration (mean over seeds and nodes)
    in ``order`` (the experiment's; by name otherwise): held-out accuracy, the reward of the
    node's own completions round by round (where the paper's learn / forget oscillation
    shows), and the two cumulative rewards, claimed and training (the paper's measure,
    partly selection: dashboards/replicate_report.SELECTION_NOTE), each seed's line faint."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11.5, 8.4))
    (acc, per_round), (cum_claimed, cum_training) = axes
    named = sorted(node_rounds["configuration"].unique().to_list())
    ranked = [c for c in order or [] if c in named] + [c for c in named if c not in (order or [])]
    for conf in ranked:
        part = node_rounds.filter(pl.col("configuration") == conf)
        seeds = part["seed"].n_unique()
        name = f"{conf} ({seeds} seed{'' if seeds == 1 else 's'})"  # thin evidence shows
        evaluated = part.filter(pl.col("accuracy").is_not_null())
        colour = _mean_line(acc, evaluated, "accuracy", marker="o", label=name).get_color()
        claimed = _per_seed_rounds(part, "claimed_reward")
        _mean_line(per_round, claimed, "claimed_reward", color=colour, label=name)
        for ax, frame in (
            (cum_claimed, claimed),
            (cum_training, _per_seed_rounds(part, "training_reward")),
        ):
            if frame.is_empty():
                continue
            for (_,), seed_part in frame.group_by("seed"):
                ax.plot(seed_part["node_round"], seed_part["cumulative"], color=colour, alpha=0.25)
            _mean_line(ax, frame, "cumulative", color=colour, label=name, linewidth=2)
    _round_axes(acc, "held-out accuracy (mean of nodes and seeds)", "Held-out accuracy")
    _round_axes(per_round, "own reward (mean of nodes and seeds)", "Own reward per round")
    _round_axes(cum_claimed, "cumulative claimed reward (mean node)",
                "Cumulative claimed reward (seeds faint)")  # fmt: skip
    _round_axes(cum_training, "cumulative training reward (mean node)",
                "Cumulative training reward (seeds faint)\n"
                "the paper's measure, partly selection")  # fmt: skip
    return _save(fig, path)
