"""The sweep report's figures (matplotlib, no display needed), one PNG each.

Inputs are the frames of the sweep SQL files; nothing here reads the ledger.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

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


def _round_axes(ax: Any, ylabel: str, title: str, *, unit_range: bool = False) -> None:
    """Rounds on x, a grid and a legend: the frame of the line figures."""
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    if unit_range:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()


def _label(row: dict[str, object]) -> str:
    policy = "" if row["policy"] == "paper" else f" {row['policy']}"
    return f"{row['local_groups']}/{row['external_groups']}{policy}"


def _configurations(summary: pl.DataFrame) -> list[dict[str, object]]:
    return summary.sort("external_groups", "policy").to_dicts()


def moving_average(values: list[float], window: int = MOVING_AVERAGE) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def reward_panels(rewards: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Per-node reward per round with a moving average, one panel per configuration."""
    plt = _pyplot()
    confs = _configurations(summary)
    cols = min(len(confs), 4)
    rows = math.ceil(len(confs) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, conf in zip(axes.flat, confs, strict=False):
        mine = rewards.filter(pl.col("swarm_id") == conf["swarm_id"])
        for (node,), part in mine.sort("node_round").group_by("node_id", maintain_order=True):
            x = part["node_round"].to_list()
            y = part["reward_mean"].to_list()
            line = ax.plot(x, y, alpha=0.25, linewidth=0.8)[0]
            ax.plot(x, moving_average(y), color=line.get_color(), linewidth=1.8, label=node)
        ax.set_title(_label(conf))
        ax.set_xlabel("round")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(confs) :]:
        ax.set_visible(False)
    axes[0][0].set_ylabel("reward (own completions)")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Reward per node and round ({MOVING_AVERAGE}-round moving average bold)")
    return _save(fig, path)


def cumulative_curves(rewards: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Cumulative reward over rounds (summed over nodes), one line per configuration."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for conf in _configurations(summary):
        per_round = (
            rewards.filter(pl.col("swarm_id") == conf["swarm_id"])
            .group_by("node_round")
            .agg(pl.col("reward_mean").sum())
            .sort("node_round")
        )
        gain = conf.get("gain_over_baseline")
        tag = "" if gain is None or conf["external_groups"] == 0 else f" ({gain:+.1%})"
        ax.plot(
            per_round["node_round"].to_list(),
            per_round["reward_mean"].cum_sum().to_list(),
            label=_label(conf) + tag,
            linewidth=1.8,
        )
    _round_axes(
        ax, "cumulative reward (all nodes)", "Cumulative reward per configuration (gain over J = 0)"
    )
    return _save(fig, path)


def zero_variance_lines(zero: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path:
    """Share of published groups whose rewards all agree, per round and configuration."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for conf in _configurations(summary):
        mine = zero.filter(pl.col("swarm_id") == conf["swarm_id"]).sort("node_round")
        y = mine["zero_variance_fraction"].to_list()
        ax.plot(mine["node_round"].to_list(), moving_average(y), label=_label(conf))
    title = f"Groups with no learning signal ({MOVING_AVERAGE}-round moving average)"
    _round_axes(ax, "zero-variance groups", title, unit_range=True)
    return _save(fig, path)


def peer_matrices(peers: pl.DataFrame, summary: pl.DataFrame, path: Path) -> Path | None:
    """Groups each receiver drew from each peer, one heat map per sharing configuration."""
    confs = [c for c in _configurations(summary) if c["external_groups"]]
    if not confs or peers.is_empty():
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(confs), figsize=(3.6 * len(confs), 3.4), squeeze=False)
    for ax, conf in zip(axes[0], confs, strict=True):
        mine = peers.filter(pl.col("swarm_id") == conf["swarm_id"])
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
        ax.set_title(_label(conf), fontsize=9)
    axes[0][0].set_ylabel("receiver")
    fig.suptitle("Peer groups drawn")
    return _save(fig, path)
