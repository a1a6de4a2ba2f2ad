"""A run served a mixture other than its plan: the `mixture_drift` alert names each component, and the
composition and run views show planned share, served share and tokens per phase (published, as the site
draws them). The runs are real executor steps that write `mixture.json` and `data/tokens/*` as the train step
does; their counts follow Levanter's block allocation (each component's count in a block rounded down, the
remainder to the largest), which is how the tiny hero's 8-sequence blocks served 0 tokens of an 8.3% cell."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from executor import THIS_OUTPUT_PATH, Executor, ExecutorStep, versioned
from executor.store.layout import METRICS_FILE
from executor.watch.site.publish import SitePublisher

SEQ_LEN, BATCH, STEPS = 64, 8, 200
DRIFTING = {"topic01_q1": 0.538, "topic00_q0": 0.083, "topic02_q1": 0.379}
EXACT = {"topic01_q1": 0.5, "topic00_q0": 0.25, "topic02_q1": 0.25}


def per_block(weights: dict[str, float], block: int) -> dict[str, int]:
    """Levanter's MixtureDataset._compute_expected_counts_per_block: floor, the remainder to the largest."""
    counts = {name: math.floor(weight * block) for name, weight in weights.items()}
    counts[max(counts, key=counts.__getitem__)] += block - sum(counts.values())
    return counts


@dataclass(frozen=True)
class MixedRunConfig:
    output_path: str
    weights: tuple[tuple[str, float], ...] = versioned(tuple(DRIFTING.items()))
    block_size: int = versioned(8)


def mixed_run(config: MixedRunConfig) -> None:
    weights = dict(config.weights)
    mixture = {"schedule": [[0, weights]], "dropped": {}, "block_size": config.block_size, "batch_size": BATCH}
    Path(config.output_path, "mixture.json").write_text(json.dumps(mixture))
    counts, served = per_block(weights, config.block_size), dict.fromkeys(weights, 0)
    lines = []
    for step in range(STEPS):
        for name, count in counts.items():  # a block of 8 sequences a step
            served[name] += count * SEQ_LEN * BATCH // config.block_size
        lines.append({"step": step, "train/loss": 5.0 - step / STEPS,
                      **{f"data/tokens/{name}": tokens for name, tokens in served.items()}})  # fmt: skip
    Path(config.output_path, METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_component_served_off_its_plan_fires_mixture_drift(tmp_path: Path) -> None:
    exact = MixedRunConfig(THIS_OUTPUT_PATH, versioned(tuple(EXACT.items())))
    steps = {
        "drifting": ExecutorStep(name="train/drifting", fn=mixed_run, config=MixedRunConfig(THIS_OUTPUT_PATH)),
        "exact": ExecutorStep(name="train/exact", fn=mixed_run, config=exact),
    }
    executor = Executor(str(tmp_path / "prefix"))
    executor.run(list(steps.values()), caller="experiments/mixed.py")
    SitePublisher(str(tmp_path / "prefix"), str(tmp_path / "site")).cycle()
    relative = {key: Path(executor.output_paths[step]).relative_to(tmp_path / "prefix").as_posix()
                for key, step in steps.items()}  # fmt: skip
    data = tmp_path / "site" / "data" / "step"

    [alert] = json.loads((data / relative["drifting"] / "alerts.json").read_text())["alerts"]
    assert alert["rule"] == "mixture_drift" and alert["step"] == 0
    assert "topic00_q0 planned 8.3% served 0.0%" in alert["message"] and "topic01_q1" not in alert["message"]
    assert json.loads((data / relative["exact"] / "alerts.json").read_text())["alerts"] == []

    for view in ("composition.json", "run.json"):
        served = json.loads((data / relative["drifting"] / view).read_text())["eaten" if view[0] == "c" else "mixture"]
        [phase] = served["phases"]
        assert phase["planned"]["topic00_q0"] == DRIFTING["topic00_q0"] and phase["served"]["topic00_q0"] == 0
        assert phase["served"]["topic01_q1"] == 5 / 8 and phase["tokens"]["topic01_q1"] == 5 * STEPS * SEQ_LEN
        assert [(found["component"], found["phase"]) for found in served["drifted"]] == [("topic00_q0", 0)]
