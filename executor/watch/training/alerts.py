"""Alerts on a running train step: rules over its `metrics.jsonl`, each firing a line of `<run>/alerts.jsonl`.

    rules = AlertRules.from_config(step_config.get("alerts"))        # thresholds from the step's config
    fired = evaluate(records, rules, now=time.time(), running=True)   # every episode in the metrics so far
    new = record_alerts(output_path, fired)                           # appended once; re-evaluation is idempotent

A rule looks at the whole series each time (the publisher re-evaluates every cycle), and an *episode* is a
run of consecutive offending steps: it fires once, at its first step, and an alert is identified by
(rule, step), so evaluating the same metrics twice appends nothing. Rules:

    nonfinite_*        any metric is NaN or infinite: nonfinite_loss (train/loss), nonfinite_eval, nonfinite_grad,
                       nonfinite_router, nonfinite_metric (nonfinite_rule.py)
    loss_spike         train/loss above the window's median by more than `loss_spike_z` robust z-scores
                       (median absolute deviation x 1.4826) and by more than `loss_spike_min_ratio`
    grad_spike         the same on grad/norm/total with `grad_spike_z` / `grad_spike_min_ratio`
    throughput_drop    tokens/s below `throughput_drop_ratio` x the window's median
    expert_imbalance   router/dropped_fraction over `max_dropped_fraction`, or router/load/max_over_mean over
                       `max_load_over_mean`
    stalled            the step is RUNNING with a live lease but its newest line is older than its allowance:
                       `stall_after_s` when set, else derived from the run's own step time (stall_rule.py)
    prediction_band    eval/macro_loss above the predicted curve's high edge (the scaling step's band) by more
                       than `band_margin`
    mixture_drift      a component served more than `mixture_drift` (relative) off its planned share over a
                       phase of at least `mixture_drift_min_blocks` mixture blocks (served_mixture.py); one
                       alert a phase, at its first step, naming each such component

Defaults stay quiet on a healthy run (the tiny demo's runs fire none: tests/executor/watch/training/test_alerts.py)
and fire on an injected NaN, spike or stall. Thresholds are plain config, never versioned: tuning an alert must
not restart a run. Firings can also be POSTed as JSON to a webhook (`post_webhook`); a webhook that fails is logged and
retried on the next cycle's new firings only, never allowed to stop the publisher.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from executor.store import storage
from executor.store.layout import ALERTS_FILE, METRICS_FILE
from executor.store.metrics_log import metric_number, rows_by_step
from executor.watch import files
from executor.watch.training.metric_names import predicted_metric
from executor.watch.training.nonfinite_rule import nonfinite_episodes
from executor.watch.training.panels import PanelError, step_config
from executor.watch.training.served_mixture import drifted, served_by_phase
from executor.watch.training.stall_rule import newest_line, stall_threshold, stalled_since

logger = logging.getLogger(__name__)

MAD_TO_SIGMA = 1.4826
Check = tuple[int, bool, float | None, float]
"""One step's verdict of a rule: (step, offends, value, threshold)."""


class AlertConfigError(ValueError):
    """A step's `alerts` config names an unknown threshold or gives one that is not a number."""


@dataclass(frozen=True)
class AlertRules:
    """Thresholds of the alert rules (module docstring). Plain config: none of these is versioned."""

    window: int = 50
    """How many earlier steps the spike and throughput rules compare a step against."""
    min_history: int = 10
    """Steps a windowed rule needs before it may fire (warm-up and compilation are noisy)."""
    loss_spike_z: float = 6.0
    """Robust z-score above the window's median loss that makes a spike."""
    loss_spike_min_ratio: float = 1.15
    """...and the loss must also exceed the median by this factor (a flat loss has a tiny deviation)."""
    grad_spike_z: float = 10.0
    """Robust z-score above the window's median gradient norm that makes a spike."""
    grad_spike_min_ratio: float = 3.0
    """...and the gradient norm must also be this many times the median."""
    sustain: int = 5
    """Consecutive readings the throughput and expert rules need past their threshold (their median is
    compared), so one slow step (an eval, a checkpoint) or one unlucky batch does not fire."""
    throughput_drop_ratio: float = 0.1
    """Tokens/s below this fraction of the window's median is a drop (the CPU demo on a shared machine swings
    5x between readings, a lost host or a straggler costs far more)."""
    max_dropped_fraction: float = 0.35
    """Share of token assignments dropped past expert capacity above which experts are imbalanced."""
    max_load_over_mean: float = 8.0
    """The busiest expert's load over the mean above which experts are imbalanced."""
    stall_after_s: float | None = None
    """A RUNNING step with a live lease and no metrics line for this long is stalled (None: derived from the run's
    step time, stall_rule.py)."""
    stall_min_s: float = 120.0
    """The derived allowance's floor."""
    stall_step_multiple: float = 20.0
    """The derived allowance in the run's median seconds a step."""
    band_margin: float = 0.05
    """How far eval/macro_loss may rise above the prediction band's high edge before it fires."""
    mixture_drift: float = 0.2
    """How far (relative) a component's served share may be off its planned share in a phase."""
    mixture_drift_min_blocks: float = 20
    """Mixture blocks a phase must span before its served shares are held to the plan (a shorter one is a sample)."""
    webhook_url: str | None = None
    """Where firings are POSTed as JSON (None: nowhere). Plain, like every field here."""

    @classmethod
    def from_config(cls, values: Mapping[str, Any] | None, where: str = "the step's config") -> AlertRules:
        """Rules from a step config's `alerts` mapping; unknown keys and non-numbers raise AlertConfigError."""
        if not values:
            return cls()
        if not isinstance(values, Mapping):
            raise AlertConfigError(f"{where}: 'alerts' must be a mapping of thresholds, got {values!r}")
        known = {field.name: field for field in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise AlertConfigError(f"{where}: unknown alert thresholds {unknown}; known: {sorted(known)}")
        for key, value in values.items():
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if key != "webhook_url" and not numeric and not (key == "stall_after_s" and value is None):
                raise AlertConfigError(f"{where}: alerts.{key} must be a number, got {value!r}")
        return cls(**dict(values))


@dataclass(frozen=True)
class Alert:
    rule: str
    step: int
    value: float | None
    threshold: float
    time: float
    message: str

    @property
    def key(self) -> tuple[str, int]:
        return (self.rule, self.step)

    def as_json(self) -> dict[str, Any]:
        numbers = {"value": _json_number(self.value), "threshold": _json_number(self.threshold)}
        return {**dataclasses.asdict(self), **numbers}


def _json_number(number: float | None) -> float | str | None:
    """JSON has no NaN or infinity: those are written as the strings "nan", "inf"."""
    return number if number is None or math.isfinite(number) else str(number)


def _raw_series(rows: Mapping[int, Mapping[str, Any]], key: str) -> list[tuple[int, float]]:
    """(step, value) in step order for rows that hold `key` as a number (NaN and inf kept, as recorded)."""
    series = []
    for step in sorted(rows):
        value = metric_number(rows[step].get(key))
        if value is not None:
            series.append((step, value))
    return series


def _episodes(offending: Iterable[Check], rule: str, now: float, what: str) -> list[Alert]:
    """One alert at the first step of each run of consecutive offending steps."""
    alerts, inside = [], False
    for step, offends, value, threshold in offending:
        if offends and not inside:
            alerts.append(
                Alert(rule, step, value, threshold, now, f"{what} at step {step}: {value} (threshold {threshold:g})")
            )
        inside = offends
    return alerts


def _window_check(series: Sequence[tuple[int, float]], rules: AlertRules, test: Any) -> Iterable[Check]:
    """(step, offends, value, threshold) of each finite point against the finite points of the window before it."""
    history: list[float] = []
    for step, value in series:
        if not math.isfinite(value):
            continue
        window = history[-rules.window :]
        if len(window) >= rules.min_history:
            offends, threshold = test(value, window)
            yield step, offends, value, threshold
        else:
            yield step, False, value, math.nan
        history.append(value)


def _spike(z_limit: float, min_ratio: float) -> Any:
    def test(value: float, window: list[float]) -> tuple[bool, float]:
        median = statistics.median(window)
        spread = MAD_TO_SIGMA * statistics.median(abs(x - median) for x in window)
        threshold = max(median + z_limit * spread, median * min_ratio)
        return value > threshold, threshold

    return test


def _sustained(series: Sequence[tuple[int, float]], count: int) -> list[tuple[int, float]]:
    """Each finite point replaced by the median of it and the `count - 1` finite points before it."""
    finite = [(step, value) for step, value in series if math.isfinite(value)]
    return [
        (step, statistics.median(value for _, value in finite[max(0, index - count + 1) : index + 1]))
        for index, (step, _) in enumerate(finite)
        if index + 1 >= count
    ]


def _drop(ratio: float) -> Any:
    def test(value: float, window: list[float]) -> tuple[bool, float]:
        threshold = ratio * statistics.median(window)
        return value < threshold, threshold

    return test


def _over(series: Sequence[tuple[int, float]], limit: float) -> Iterable[Check]:
    return ((step, value > limit, value, limit) for step, value in series if math.isfinite(value))


def below_band(
    rows: Mapping[int, Mapping[str, Any]], curve: Sequence[Mapping[str, float]], margin: float, now: float
) -> list[Alert]:
    """The predicted metric (eval/suite/macro_loss with an eval suite, else eval/macro_loss) against the predicted
    band's high edge, linearly interpolated between curve points."""
    points = sorted((point["step"], point["high"]) for point in curve)
    if len(points) < 2:
        return []
    checks = []
    metric = predicted_metric(rows)
    for step, value in _raw_series(rows, metric):
        if not points[0][0] <= step <= points[-1][0] or not math.isfinite(value):
            continue
        upper = next(index for index, point in enumerate(points) if point[0] >= step)
        (x0, y0), (x1, y1) = points[max(upper - 1, 0)], points[upper]
        high = y1 if x1 == x0 else y0 + (y1 - y0) * (step - x0) / (x1 - x0)
        checks.append((step, value > high + margin, value, high + margin))
    return _episodes(checks, "prediction_band", now, f"{metric} above the prediction band")


def evaluate(
    records: Sequence[Mapping[str, Any]],
    rules: AlertRules,
    *,
    now: float,
    running: bool = False,
    curve: Sequence[Mapping[str, float]] = (),
    mixture: Mapping[str, Any] | None = None,
) -> list[Alert]:
    """Every episode of every rule in a run's metrics lines so far (`running`: its lease is live now; `mixture`:
    the run's mixture.json, for mixture_drift)."""
    rows = rows_by_step(records)
    alerts = [
        Alert(rule, step, value, math.inf, now, message) for rule, step, value, message in nonfinite_episodes(rows)
    ]
    loss = _raw_series(rows, "train/loss")
    alerts += _episodes(
        _window_check(loss, rules, _spike(rules.loss_spike_z, rules.loss_spike_min_ratio)),
        "loss_spike",
        now,
        "train/loss spiked",
    )
    grad = _raw_series(rows, "grad/norm/total")
    alerts += _episodes(
        _window_check(grad, rules, _spike(rules.grad_spike_z, rules.grad_spike_min_ratio)),
        "grad_spike",
        now,
        "grad/norm/total spiked",
    )
    throughput = _sustained(_raw_series(rows, "throughput/tokens_per_second"), rules.sustain)
    alerts += _episodes(
        _window_check(throughput, rules, _drop(rules.throughput_drop_ratio)),
        "throughput_drop",
        now,
        "throughput dropped",
    )
    dropped = _over(_sustained(_raw_series(rows, "router/dropped_fraction"), rules.sustain), rules.max_dropped_fraction)
    alerts += _episodes(dropped, "expert_imbalance", now, "router/dropped_fraction too high")
    load = _over(_sustained(_raw_series(rows, "router/load/max_over_mean"), rules.sustain), rules.max_load_over_mean)
    alerts += _episodes(load, "expert_imbalance", now, "router/load/max_over_mean too high")
    alerts += below_band(rows, curve, rules.band_margin, now)
    alerts += mixture_drift(records, mixture, rules, now)
    if running:
        alerts += stalled(records, rules, now)
    return sorted(alerts, key=lambda alert: (alert.step, alert.rule))


def mixture_drift(
    records: Iterable[Mapping[str, Any]], mixture: Mapping[str, Any] | None, rules: AlertRules, now: float
) -> list[Alert]:
    """One alert per phase whose served mixture drifted from its plan (served_mixture.drifted)."""
    if not mixture:
        return []
    by_phase: dict[int, list[dict[str, Any]]] = {}
    for found in drifted(served_by_phase(records, mixture), rules.mixture_drift, rules.mixture_drift_min_blocks):
        by_phase.setdefault(found["start_step"], []).append(found)
    alerts = []
    for start, components in sorted(by_phase.items()):
        worst = max(abs(found["served"] / found["planned"] - 1) for found in components)
        names = ", ".join(f"{found['component']} planned {found['planned']:.1%} served {found['served']:.1%}"
                          for found in components)  # fmt: skip
        alerts.append(Alert("mixture_drift", start, worst, rules.mixture_drift, now,
                            f"the mixture phase from step {start} is not served as planned: {names}"))  # fmt: skip
    return alerts


def stalled(
    records: Sequence[Mapping[str, Any]], rules: AlertRules, now: float, after_s: float | None = None
) -> list[Alert]:
    """A stall is keyed by the step of the newest line, so one stall fires once however long it lasts; `after_s`:
    the allowance when already derived (else from `records`: stall_rule.stall_threshold)."""
    line = newest_line(records)
    if after_s is None:
        after_s = stall_threshold(records, rules.stall_after_s, rules.stall_min_s, rules.stall_step_multiple)
    if line is None or stalled_since(line, after_s, now) is None:
        return []
    quiet = now - line["time"]
    message = (f"no metrics line since step {line['step']} for {quiet:.0f} s when noticed (allowed: {after_s:.0f} s) "
               "while the step's lease is live")  # fmt: skip
    return [Alert("stalled", line["step"], quiet, after_s, now, message)]


def stall_inputs(output_path: str, rules: AlertRules) -> tuple[dict[str, Any] | None, float]:
    """The run's newest line and its stall allowance (stall_rule.py), from the newest lines of its metrics
    (`files.metrics_tail_records`): a long run's whole file is never read for them, and the first
    `files.MAX_METRICS_BYTES` the other rules read would hold only its early lines, and call it stalled."""
    records = files.metrics_tail_records(storage.join(output_path, METRICS_FILE)) or []
    after_s = stall_threshold(records, rules.stall_after_s, rules.stall_min_s, rules.stall_step_multiple)
    return newest_line(records), after_s


def step_rules(output_path: str, where: str) -> AlertRules:
    """The rules of the step at `output_path`, from the `alerts` of the config it recorded (the defaults when it
    recorded none); `where` names the step in a warning or an AlertConfigError."""
    try:
        config = step_config(output_path)
    except PanelError as error:
        logger.warning("%s: no config for its alerts: %s", where, error)
        config = {}
    return AlertRules.from_config(config.get("alerts"), where)


def read_alerts(output_path: str) -> list[dict[str, Any]]:
    """The lines of `<run>/alerts.jsonl` ([] when there is none; a torn last line is skipped)."""
    text = storage.read_text(storage.join(output_path, ALERTS_FILE))
    alerts = []
    for line in (text or "").splitlines():
        try:
            alerts.append(json.loads(line))
        except ValueError:
            logger.warning("skipping a torn line of %s", storage.join(output_path, ALERTS_FILE))
    return alerts


def record_alerts(output_path: str, alerts: Sequence[Alert]) -> list[Alert]:
    """Append the alerts not yet in `<run>/alerts.jsonl` (by rule and step); returns those appended.

    The file is rewritten whole (object stores cannot append); it holds one line per episode, so it stays small.
    """
    existing = read_alerts(output_path)
    seen = {(line.get("rule"), line.get("step")) for line in existing}
    new = [alert for alert in alerts if alert.key not in seen]
    if new:
        lines = [json.dumps(line) for line in existing] + [json.dumps(alert.as_json()) for alert in new]
        storage.write_atomic(storage.join(output_path, ALERTS_FILE), "\n".join(lines) + "\n")
    return new


def webhook_text(run: str, alerts: Sequence[Alert]) -> str:
    """The alerts as one message, for the chat tools (Slack, Discord, Mattermost) that show a `text` field."""
    lines = [f"{len(alerts)} alert(s) on {run}:"]
    lines += [f"- {alert.rule} at step {alert.step}: {alert.message}" for alert in alerts]
    return "\n".join(lines)


def post_webhook(url: str, run: str, alerts: Sequence[Alert], timeout_s: float = 10.0) -> bool:
    """POST `{"text": ..., "run": ..., "alerts": [...]}` to `url`; False (logged) when the hook cannot be reached."""
    payload = {"text": webhook_text(run, alerts), "run": run, "alerts": [alert.as_json() for alert in alerts]}
    return post_json(url, run, payload, timeout_s)


def post_json(url: str, run: str, payload: Mapping[str, Any], timeout_s: float = 10.0) -> bool:
    """POST a JSON message about `run` to a webhook; False (logged) when the hook cannot be reached."""
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError) as error:
        # The hook's path and any credentials in it are a secret: the log names its host only.
        logger.warning("webhook on %s failed for %s: %s", urllib.parse.urlsplit(url).hostname, run, error)
        return False
