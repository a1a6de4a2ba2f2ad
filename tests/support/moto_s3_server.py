"""`moto_server` with S3's conditional writes decided atomically, as S3 decides them.

moto checks a PUT's `If-None-Match: *` against the bucket and then stores the object, as two steps of a
threaded server, so two concurrent creates of one key can both succeed there: a race of the stand-in (seen as
2 winners of 12 in `test_exclusive_create_and_leases_have_one_winner_on_s3`), where S3 answers one of them
412. One lock around moto's object writes (a PUT, a multipart completion) makes its check and its write one
step. Run as `moto_server` is: `python tests/support/moto_s3_server.py -H 127.0.0.1 -p PORT`.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_WRITES = threading.Lock()


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def serialized(*args: Any, **kwargs: Any) -> Any:
        with _WRITES:
            return method(*args, **kwargs)

    return serialized


S3Response.put_object = _one_at_a_time(S3Response.put_object)  # type: ignore[method-assign]
S3Response._key_response_post = _one_at_a_time(S3Response._key_response_post)  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
