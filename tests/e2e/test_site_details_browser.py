"""The smaller things a member of the public sees on the published site, in Chromium: a train step's page has one
planned-against-served table, not two; a step that logs no metrics asks for no metrics.json (no 404); y-axis
ticks keep the digits that make them exact (7.5, not "8"); a long DAG opens with labels that can be read.

Screenshot: `$TEST_ARTIFACTS_DIR/dashboard/site-long-dag.png`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_fixtures import DEADLINE_MS, expect, screenshot
from test_publish_browser import static_server
from test_served_mixture import MixedRunConfig, mixed_run

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, output_path_of, versioned
from executor.watch.site.publish import SitePublisher

pytestmark = pytest.mark.browser
CHAIN = 30


@dataclass(frozen=True)
class LinkConfig:
    output_path: str
    upstream: str | None = None
    number: int = versioned(0)


def link(config: LinkConfig) -> None:
    Path(config.output_path, "done.txt").write_text(str(config.number))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A mixture run and a chain of CHAIN plain steps (a DAG 30 ranks wide), run and published."""
    root = tmp_path_factory.mktemp("details")
    chain = [ExecutorStep(name="chain/link00", fn=link, config=LinkConfig(THIS_OUTPUT_PATH))]
    for number in range(1, CHAIN):
        config = LinkConfig(THIS_OUTPUT_PATH, output_path_of(chain[-1]), versioned(number))
        chain.append(ExecutorStep(name=f"chain/link{number:02d}", fn=link, config=config))
    mixed = ExecutorStep(name="train/mixed", fn=mixed_run, config=MixedRunConfig(THIS_OUTPUT_PATH))
    executor = Executor(str(root / "prefix"))
    executor.run([*chain, mixed], caller="experiments/details.py")
    SitePublisher(str(root / "prefix"), str(root / "site")).cycle()
    relative = {step.name: Path(executor.output_paths[step]).relative_to(root / "prefix").as_posix()
                for step in [chain[0], mixed]}  # fmt: skip
    return {"site": root / "site", "relative": relative}


def test_one_planned_against_served_table_and_no_request_for_missing_metrics(page, site) -> None:  # type: ignore[no-untyped-def]
    missing: list[str] = []
    page.on("response", lambda response: missing.append(response.url) if response.status >= 400 else None)
    with static_server(site["site"]) as base:
        page.goto(f"{base}/index.html#/step/{site['relative']['train/mixed']}")
        expect(page.locator('[data-view="composition"] [data-testid=eaten-table]')).to_have_count(
            1, timeout=DEADLINE_MS
        )
        expect(page.locator("[data-testid=eaten-table]")).to_have_count(1)  # not a second one in the run view
        expect(page.locator("[data-testid=run-mixture]")).to_contain_text("in the Data composition view below")
        page.goto(f"{base}/index.html#/step/{site['relative']['chain/link00']}")
        expect(page.locator("[data-testid=step-status]")).to_have_text("SUCCESS", timeout=DEADLINE_MS)
        expect(page.locator("[data-testid=history] tbody tr").first).to_be_visible()
        expect(page.locator('[data-section="Metrics"]')).to_be_hidden()
        page.wait_for_load_state("networkidle")
    assert not missing, missing


def test_ticks_are_exact_and_evenly_written(page, site) -> None:  # type: ignore[no-untyped-def]
    with static_server(site["site"]) as base:
        page.goto(f"{base}/index.html")
        expect(page.locator("[data-testid=experiments] tbody tr")).to_have_count(1, timeout=DEADLINE_MS)
        assert page.evaluate("tickLabels(null, [5, 7.5, 10, 12.5])") == ["5.0", "7.5", "10.0", "12.5"]
        assert page.evaluate("tickLabels(null, [0, 2, 4, 6])") == ["0", "2", "4", "6"]
        assert page.evaluate("tickLabels(null, [2.25, 2.5, 2.75, 3])") == ["2.25", "2.50", "2.75", "3.00"]
        labels = page.evaluate("tickLabels(null, [0.0001, 0.00015, 0.0002, 0.00025])")
        assert labels == ["1.0e-4", "1.5e-4", "2.0e-4", "2.5e-4"], labels


def test_a_long_dag_opens_with_readable_labels(page, site) -> None:  # type: ignore[no-untyped-def]
    with static_server(site["site"]) as base:
        page.goto(f"{base}/index.html")
        page.locator("[data-testid=experiments] tbody tr").first.click()
        nodes = page.locator("[data-testid=dag] g.node")
        expect(nodes).to_have_count(CHAIN + 1, timeout=DEADLINE_MS)
        label = page.locator('[data-testid=dag] g.node[data-node="chain/link00"] text')
        height = label.bounding_box()["height"]
        assert height >= 9, height  # drawn at 12 px x at least 0.8; fitted whole, 31 ranks would draw it at ~2 px
        assert float(page.locator("[data-testid=dag]").get_attribute("data-scale")) >= 0.8
        screenshot(page, "site-long-dag")
