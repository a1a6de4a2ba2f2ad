"""store/: how bytes reach a store, and what a step folder holds: the lowest room.

    storage.py     every read, write, listing and exclusive create, on any fsspec store, with retries
    layout.py      every name a step folder may hold, and the prefix's experiment files
    events.py      `.executor_status`: the one parser and writer of a step's event history
    step_rows.py   the one model of a step's state (status, attempts, times, drift, progress) and its listings
    experiments.py the one reader of the prefix's experiment files
    lease.py       numbered leases on exclusive create: who runs a step, and when a holder is lost
    processes.py   a process on this machine named by its pid and start time, so pid reuse cannot pass for it
    step_log.py    a step's `logs/step.log`, uploaded while it runs
    metrics_log.py a step's live `metrics.jsonl` on any store
    probe.py       one bounded look at a command-line target before anything reads it

Imports only errors and retry: everything else in the executor stands on it.
"""
