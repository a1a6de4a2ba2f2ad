#!/usr/bin/env bash
# Start the local storage services the tests use, for trying things by hand:
#   gcp-storage-emulator  a GCS JSON API, in memory, with one bucket  (gcsfs, gs:// paths)
#   moto_server           an S3 API with one bucket                   (s3fs, s3:// paths)
# Both listen on 127.0.0.1 only. The script prints the environment to export in another shell,
# then waits; Ctrl-C (or SIGTERM) stops both. Nothing is kept: every start begins empty.
#
# Usage: infra/start_local_services.sh [--gcs-port N] [--s3-port N] [--bucket NAME] [--env-file PATH]
#   --env-file PATH  also write the exports to PATH (then `source PATH` in the other shell)
#
# The GCS emulator does not enforce preconditions (ifGenerationMatch=0), so exclusive create, and
# with it the lease's exactly-once guarantee, is only really exercised on S3 (moto enforces
# If-None-Match: *) and on local files.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.venv/bin"
gcs_port=9023
s3_port=9024
bucket=executor-test
env_file=""

usage() { sed -n '8,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --gcs-port) gcs_port="${2:?}"; shift 2 ;;
    --s3-port) s3_port="${2:?}"; shift 2 ;;
    --bucket) bucket="${2:?}"; shift 2 ;;
    --env-file) env_file="${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done

for tool in python gcp-storage-emulator moto_server; do
  if [ ! -x "$bin/$tool" ]; then
    echo "$bin/$tool not found: run 'make install' first (the services come with the project's venv)." >&2
    exit 1
  fi
done

port_is_free() {
  "$bin/python" -c 'import socket, sys
with socket.socket() as s:
    try:
        s.bind(("127.0.0.1", int(sys.argv[1])))
    except OSError:
        sys.exit(1)' "$1"
}
for port in "$gcs_port" "$s3_port"; do
  if ! port_is_free "$port"; then
    echo "port $port on 127.0.0.1 is in use; pick others with --gcs-port / --s3-port." >&2
    exit 1
  fi
done

logs="$(mktemp -d -t executor-services.XXXXXX)"
keep_logs=1   # until both services are up; a clean Ctrl-C stop then removes them
pids=()
# shellcheck disable=SC2329  # run by the EXIT trap below
stop_services() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$keep_logs" = 1 ]; then
    echo "stopped (logs kept in $logs)" >&2
  else
    rm -rf "$logs"
    echo "stopped" >&2
  fi
}
trap stop_services EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$bin/gcp-storage-emulator" start --host 127.0.0.1 --port "$gcs_port" --in-memory \
  --default-bucket "$bucket" >"$logs/gcs.log" 2>&1 &
pids+=("$!")
"$bin/moto_server" -H 127.0.0.1 -p "$s3_port" >"$logs/s3.log" 2>&1 &
pids+=("$!")

# Wait until both answer HTTP, and create the S3 bucket (moto starts with none; it accepts
# unsigned requests). Fails after 30 s, pointing at the logs.
"$bin/python" - "$gcs_port" "$s3_port" "$bucket" "$logs" <<'PY'
import sys
import time
import urllib.error
import urllib.request

gcs_port, s3_port, bucket, logs = sys.argv[1:]

def ask(method: str, url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code

checks = {
    "gcs": f"http://127.0.0.1:{gcs_port}/storage/v1/b/{bucket}",
    "s3": f"http://127.0.0.1:{s3_port}/",
}
deadline = time.monotonic() + 30
while checks:
    for name, url in list(checks.items()):
        try:
            if ask("GET", url) == 200:
                del checks[name]
        except OSError:
            pass
    if checks and time.monotonic() > deadline:
        sys.exit(f"{', '.join(checks)} did not come up within 30 s; see {logs}/<name>.log")
    time.sleep(0.2)
status = ask("PUT", f"http://127.0.0.1:{s3_port}/{bucket}")
if status != 200:
    sys.exit(f"creating s3://{bucket} on moto answered HTTP {status}; see {logs}/s3.log")
PY

exports="$(cat <<EOF
export STORAGE_EMULATOR_HOST=http://127.0.0.1:$gcs_port
export FSSPEC_GS_TOKEN=anon
export GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_DEFAULT_REGION=us-east-1
export AWS_ENDPOINT_URL_S3=http://127.0.0.1:$s3_port
export FSSPEC_S3_ENDPOINT_URL=http://127.0.0.1:$s3_port
EOF
)"
if [ -n "$env_file" ]; then
  printf '%s\n' "$exports" >"$env_file"
fi

cat <<EOF
Local storage services are up (127.0.0.1 only, in memory):
  GCS emulator  http://127.0.0.1:$gcs_port   bucket gs://$bucket
  S3 (moto)     http://127.0.0.1:$s3_port   bucket s3://$bucket
Export these in the shell that runs the executor or the tests$([ -n "$env_file" ] && echo " (or: source $env_file)"):

$exports

GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT must be set before gcsfs is imported. Example:
  python experiments/demo.py --prefix gs://$bucket/runs
Ctrl-C stops both services.
EOF
keep_logs=0

# Return when either service dies (reporting it) or on Ctrl-C; the EXIT trap stops the other.
set +e
wait -n "${pids[@]}"
code=$?
keep_logs=1
echo "a service exited (status $code); see $logs/gcs.log and $logs/s3.log" >&2
exit 1
