"""The report in a real browser (issue 47): report.html of a short swarm, opened in headless
Chromium (Debian's package), loads without a console error, and every figure on it shows
data: pixels in colour, not only axes, grid and text (a one-round swarm's figures had none).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from flows.reports.report import report_ledger
from ledger import Ledger
from ledger.synthetic import synthetic_round

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def short_swarm(root: Path, rounds: int) -> None:
    """A swarm of three nodes, two sharing, over ``rounds`` rounds, in a ledger at ``root``."""
    with Ledger.open(str(root)) as led:
        for node_round in range(rounds):
            for k, node in enumerate(("node-0", "node-1", "node-2")):
                led.publish(
                    synthetic_round(
                        "short", node, node_round, n_groups=3, group_size=4, skill=0.2 + 0.3 * k
                    )
                )
            for node in ("node-0", "node-1"):
                drawn = led.sample(node, 2, "paper", seed=node_round, swarm_id="short")
                led.write_sample("short", node, node_round, drawn, policy="paper", seed=node_round)


def coloured_pixels(png: bytes) -> int:
    """Pixels whose channels differ (data lines, markers, heat maps), not greys."""
    import matplotlib.image

    image = matplotlib.image.imread(io.BytesIO(png), format="png")[..., :3]
    return int(((image.max(axis=-1) - image.min(axis=-1)) > 0.25).sum())


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run does)")
@pytest.mark.parametrize("rounds", [1, 3])
def test_the_report_opens_in_chromium_and_every_figure_shows_data(
    tmp_path: Path, rounds: int
) -> None:
    from playwright.sync_api import sync_playwright

    short_swarm(tmp_path / "ledger", rounds)
    made = report_ledger(str(tmp_path / "ledger"), tmp_path / "report")
    errors: list[str] = []
    with sync_playwright() as play:
        browser = play.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(made.html.resolve().as_uri(), wait_until="load")
            images = page.locator("img")
            assert images.count() >= 4  # rewards, cumulative, zero variance, sampled peers
            for k in range(images.count()):
                image = images.nth(k)
                assert image.evaluate("i => i.complete && i.naturalWidth > 0"), k
                image.scroll_into_view_if_needed()
                shown = coloured_pixels(image.screenshot())
                # A figure's legend alone colours ~100 pixels (a one-round swarm's figures
                # showed no more); its data, one round's markers included, over 200.
                assert shown > 180, (k, image.get_attribute("alt"), shown)
        finally:
            browser.close()
    assert errors == []
