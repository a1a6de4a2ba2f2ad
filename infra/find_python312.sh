#!/usr/bin/env bash
# Print the path of a Python 3.12 interpreter, or explain how to get one and exit 1.
# Looks on PATH first, then in pyenv (whose python3.12 shim only works when 3.12 is selected).
set -u
is_312() { "$@" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' >/dev/null 2>&1; }

for candidate in python3.12 python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 && is_312 "$candidate"; then
    command -v "$candidate"; exit 0
  fi
done
root="${PYENV_ROOT:-$HOME/.pyenv}"
if command -v pyenv >/dev/null 2>&1; then
  root="$(pyenv root)"
fi
for candidate in $(ls -d "$root"/versions/3.12*/bin/python3.12 2>/dev/null | sort -rV); do
  if is_312 "$candidate"; then echo "$candidate"; exit 0; fi
done
for candidate in /usr/bin/python3.12 /usr/local/bin/python3.12 /opt/homebrew/bin/python3.12; do
  if [ -x "$candidate" ] && is_312 "$candidate"; then echo "$candidate"; exit 0; fi
done
cat >&2 <<'MSG'
No Python 3.12 found (looked on PATH, in pyenv's versions, and in /usr/bin and /usr/local/bin).
This project needs Python 3.12 (the current Levanter requires it). Install one, e.g.:
  pyenv install 3.12      or      apt-get install python3.12 python3.12-venv
then run `make install` again, or pass PYTHON=/path/to/python3.12.
MSG
exit 1
