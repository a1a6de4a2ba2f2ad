"""Run one data step over one input file in this fresh process and print its peak RSS.

    python tests/support/long_document_run.py tokenize <input.jsonl> <output> <tokenizer> <threads> [max_document_chars]
    python tests/support/long_document_run.py dedup <input.jsonl> <output> [hash_window_chars]

`tests/steps/data/test_long_documents.py` runs it once per step, so that the peak it reads (VmHWM, the process's high
water mark of resident memory, from /proc/self/status) is that step's alone and not the test process's.
The last line printed is a JSON object: `{"peak_rss_bytes": ...}`. A limit of 0 turns the bound off.
`<threads>`, the encoding threads, stand in for a machine's cores (`ENCODE_THREADS` is the CPU count): 16 of
them on 2 cores hold as many batches half-encoded at once as 16 cores would.
"""

from __future__ import annotations

import json
import sys


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (not Linux?)")


def main(argv: list[str]) -> None:
    step, input_path, output_path, *rest = argv
    if step == "tokenize":
        from steps.tokenize import tokenize as tokenize_module
        from steps.tokenize.tokenize import TokenizeConfig, tokenize

        tokenizer_path, threads, *limit = rest
        tokenize_module.ENCODE_THREADS = tokenize_module.ENCODE_AHEAD = int(threads)
        options = {"max_document_chars": int(limit[0])} if limit else {}
        tokenize(TokenizeConfig(input_paths=[input_path], tokenizer_path=tokenizer_path, output_path=output_path,
                                validation_fraction=0.0, parallelism="thread", max_workers=1, **options))  # fmt: skip
    elif step == "dedup":
        from steps.dedup.dedup_exact import ExactDedupConfig, exact_dedup

        options = {"hash_window_chars": int(rest[0])} if rest else {}
        exact_dedup(ExactDedupConfig(input_paths=[input_path], output_path=output_path, parallelism="thread",
                                     **options))  # fmt: skip
    else:
        raise ValueError(f"unknown step {step!r}: tokenize or dedup")
    print(json.dumps({"peak_rss_bytes": peak_rss_bytes()}))


if __name__ == "__main__":
    main(sys.argv[1:])
