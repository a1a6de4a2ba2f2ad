"""gcp-storage-emulator with two behaviours of real GCS that it lacks and tensorstore's GCS client needs.

    python tests/support/gcs_emulator.py --port PORT --bucket BUCKET     # in memory, until terminated

1. A media download carries the object's generation in `x-goog-generation` (and `x-goog-metageneration`),
   as GCS sends them: tensorstore reads the generation of every object it reads and fails with
   "Malformed StorageGeneration" without it.
2. A suffix byte range, `Range: bytes=-N` (the last N bytes; RFC 9110, served by GCS), is answered with
   those bytes: the emulator ignores it and sends the whole object, and tensorstore, reading the index at
   the end of a zarr3 shard that way, fails with "Requested byte range [-8196, ?) was ignored by server".

Everything else is the emulator as published; gcsfs sees the same server (tests/support/services.py). It still
ignores `ifGenerationMatch`, so exclusive-create semantics are proven on S3 and local files.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # not found: the emulator's own handler answers
        return _download(request, response, storage, *args, **kwargs)
    response["x-goog-generation"] = obj["generation"]
    response["x-goog-metageneration"] = obj.get("metageneration", "1")
    headers = request._request_handler.headers
    wanted = (headers.get("range") or "").strip()
    if wanted.startswith("bytes=-"):
        start = max(0, int(obj["size"]) - int(wanted.removeprefix("bytes=-")))
        del headers["range"]
        headers["range"] = f"bytes={start}-"
    return _download(request, response, storage, *args, **kwargs)


def patch() -> None:
    objects.download = download  # `objects.get` with alt=media calls it by this name
    for _route, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is _download:
                handlers[method] = download


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", required=True)
    args = parser.parse_args()
    patch()
    server.create_server("127.0.0.1", args.port, in_memory=True, default_bucket=args.bucket).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
