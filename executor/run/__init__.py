"""run/: one run of a DAG: select what runs, schedule it on a backend, run each step under its lease.

    executor.py       Executor: plan, select, schedule, record; what `executor_main` drives
    selection.py      which steps run, skip, wait or are refused (--run_only, --force_run, leases, failures)
    force_guard.py    what a forced rerun would discard (a train step's checkpoints), said before it is
    scheduler.py      dependency order, concurrency, retries with backoff
    backends.py       local threads/processes and Ray, interchangeable
    step_task.py      what a backend hands a worker (StepTask) and gets back (StepResult)
    step_runner.py    one step's attempts: lease, heartbeat, status events, log, manifest, SUCCESS last
    interrupts.py     Ctrl-C and SIGTERM: stop at a step boundary, or abort
    collector.py      Python's garbage collector collecting rarely while a step runs
    cpu_devices.py    fake CPU JAX devices for a step's stand-in hosts
    gang.py           a multi-host step as a gang of Ray actors, watched by progress
    gang_member.py    one host of a gang
    gang_progress.py  how far a step's loop got, for the gang's watch (`from executor import progress`)

May import dag/, shards/, store/ (and errors, retry).
"""
