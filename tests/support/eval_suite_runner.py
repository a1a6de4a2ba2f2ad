"""Run the tiny hero's eval suite text step in a process of its own: `python tests/support/eval_suite_runner.py PREFIX`.

Prints one JSON line: the step's output path and what this process sees under /usr/share, so that a test running it
with /usr/share hidden (tests/steps/evaluate/test_eval_suite.py) can check the hiding took."""

from __future__ import annotations

import json
import os
import sys

from executor import Executor
from experiments.eval_suite import TINY_SUITE_SUBSETS, default_eval_suite_text


def main(prefix: str) -> int:
    step = default_eval_suite_text(TINY_SUITE_SUBSETS)
    executor = Executor(prefix)
    executor.run([step])
    print(json.dumps({"output_path": executor.output_paths[step], "usr_share": sorted(os.listdir("/usr/share"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
