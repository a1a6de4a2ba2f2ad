"""watch/training/: the views and alert rules that know the training steps' files and metric names.

    panels.py            which views a step's outputs call for, and the helpers they share
    run_view.py          a run's charts against its predicted curve and band, incidents, mixture served
    ladder_view.py       the ladder: rungs, fit, prediction, achieved loss
    composition_view.py  topic x quality cells, weights per phase, planned against served
    served_mixture.py    the mixture a train step served against the one it planned
    alerts.py            the alert rules a watched run is held to (loss spikes, the band, mixture drift)
    nonfinite_rule.py    the nonfinite_* rules: a NaN or infinite value of any metric, by what it measures
    stall_rule.py        when a running run has gone quiet too long, from its own pace
    live_stalls.py       which running runs are stalled now, for the live dashboard with no publisher
    metric_names.py      the metric names these read (train/loss, the eval macro loss)

The executor runs any DAG; these read what `steps/train`, `steps/evaluate` and `steps/scaling` write, by the
names in executor/store/layout.py. May import watch/'s generic modules and the rooms below watch/.
"""
