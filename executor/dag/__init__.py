"""dag/: what a step is and how a DAG of them is named: spec, identity, plan, and the records of both.

    spec.py        ExecutorStep, versioned(), output_path_of(), ResourceConfig: what an experiment file writes
    identity.py    the version dict and hash of a step (pure: no I/O)
    plan.py        a DAG resolved to output paths, in dependency order
    patterns.py    --run_only / --force_run patterns, globs refused
    explain.py     why a step's hash is what it is, against the other versions stored beside it
    records.py     `.executor_info`, the experiment file and the manifest with its digest
    pins.py        pin files: the bytes a published result depends on
    compare.py     two prefixes, step by step: the same results under the same hashes?
    equivalence.py whether files that differ in bytes hold the same result (times, prefixes, checkpoint databases)

May import store/, shards/ (and errors, retry).
"""
