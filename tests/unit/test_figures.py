"""Every figure of the report shows its points: a one-round swarm drew lines of one point
(invisible) on an axis ticked at fractions of a round, and a three-round figure said
"5-round moving average" (issue 47)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from dashboards import figures
from tests.unit.test_report import rewards_frame


def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the module makes, kept open (its `_save` closes them once written)."""
    made: list[Any] = []
    save = figures._save

    def keep(fig: Any, path: Path) -> Path:
        made.append(fig)
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    return made


def data_pixels(ax: Any) -> int:
    """Coloured pixels inside ``ax`` with its legend hidden: what its data draws (axes,
    grid and text are grey or black)."""
    legend = ax.get_legend()
    if legend is not None:
        legend.set_visible(False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(ax.figure)  # the figure was closed once written
    canvas.draw()
    image = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    box = ax.get_window_extent()
    height = image.shape[0]
    inside = image[int(height - box.y1) : int(height - box.y0), int(box.x0) : int(box.x1)]
    colour = inside.max(axis=-1) - inside.min(axis=-1)
    return int((colour > 60).sum())


@pytest.mark.parametrize("rounds", [1, 3])
def test_each_figure_of_a_short_swarm_shows_its_points(
    rounds: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewards = rewards_frame().filter(pl.col("node_round") < rounds)
    summary = rewards.group_by("swarm_id", "local_groups", "external_groups", "policy").agg(
        pl.lit(None, dtype=pl.Float64).alias("gain_over_baseline")
    )
    zero = rewards.group_by("swarm_id", "node_round").agg(
        pl.lit(0.5).alias("zero_variance_fraction")
    )
    made = drawn(monkeypatch)
    figures.reward_panels(rewards, summary, tmp_path / "r.png")
    figures.cumulative_curves(rewards, summary, tmp_path / "c.png")
    figures.zero_variance_lines(zero, summary, tmp_path / "z.png")
    assert len(made) == 3
    for fig in made:
        for ax in (a for a in fig.axes if a.get_visible()):
            assert data_pixels(ax) > 20, ax.get_title()
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
    titles = " ".join(f.get_suptitle() + " ".join(a.get_title() for a in f.axes) for f in made)
    assert "5-round" not in titles
    if rounds == 3:
        assert "3-round moving average" in titles
