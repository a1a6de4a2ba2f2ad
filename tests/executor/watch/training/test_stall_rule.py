"""A stall is called from the run's own pace (training/stall_rule.py), within minutes by default, not after a
fixed 30 minutes; a config's `stall_after_s` still wins."""

from __future__ import annotations

from publish_dag import metrics_line

from executor.watch.training.alerts import AlertRules, evaluate
from executor.watch.training.stall_rule import MAX_STALL_S, stall_threshold


def paced(seconds: list[float]) -> list[dict[str, object]]:
    """A run's lines, the n-th gap between them `seconds[n]` long."""
    times = [0.0]
    for gap in seconds:
        times.append(times[-1] + gap)
    return [metrics_line(step, time_s=1_700_000_000.0 + stamp) for step, stamp in enumerate(times)]


def derived(records: list[dict[str, object]]) -> float:
    rules = AlertRules()
    return stall_threshold(records, rules.stall_after_s, rules.stall_min_s, rules.stall_step_multiple)


def test_the_allowance_follows_the_runs_step_time() -> None:
    assert derived(paced([1.0] * 100)) == 120  # a fast run: the two-minute floor
    assert derived(paced([30.0] * 100)) == 600  # 20 of its steps
    assert derived(paced([1.0] * 50 + [200.0] + [1.0] * 50)) == 300  # 1.5 x its slowest (an eval, a checkpoint)
    assert derived(paced([1.0] * 50 + [7200.0] + [1.0] * 50)) == 120  # a restart hours later is no pace
    assert derived(paced([300.0] * 100)) == MAX_STALL_S  # never later than the old fixed default
    assert derived([]) == 120
    assert stall_threshold(paced([1.0] * 10), 45.0, 120.0, 20.0) == 45.0  # the config's own wins


def test_a_stall_of_a_two_second_a_step_run_is_called_within_minutes() -> None:
    records = paced([2.0] * 60)
    last = float(records[-1]["time"])  # type: ignore[arg-type]
    assert evaluate(records, AlertRules(), now=last + 100, running=True) == []
    [alert] = evaluate(records, AlertRules(), now=last + 130, running=True)
    assert (alert.rule, alert.step, alert.threshold) == ("stalled", 60, 120)
    assert alert.message.startswith("no metrics line since step 60 for 130 s when noticed (allowed: 120 s)")
