"""Run the sharded test DAG in a process of its own:
`python tests/support/dag_runner.py PREFIX COUNTER_DIR [SHARDS] [SLEEP]`.

The fault tests start this as a subprocess so they can SIGKILL it, or run ten at once.
"""

from __future__ import annotations

import logging
import sys

import sharded_steps

from executor import Executor


def main(argv: list[str]) -> int:
    prefix, counter_dir = argv[0], argv[1]
    shards = int(argv[2]) if len(argv) > 2 else 12
    sleep_s = float(argv[3]) if len(argv) > 3 else 0.0
    parallelism = argv[4] if len(argv) > 4 else "thread"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    steps = sharded_steps.build_dag(shards=shards, counter_dir=counter_dir, parallelism=parallelism, sleep_s=sleep_s)
    Executor(prefix).run(steps, max_concurrent=4)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
