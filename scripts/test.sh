#!/usr/bin/env bash
# Install mtgpu with its test tools, then run the whole test suite (as root: the
# tests create Linux users, cgroups and real server processes, and remove them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
VENV=${MTGPU_VENV:-/opt/mtgpu/venv}
set +e
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=25 "$@"
rc=$?
set -e
if [ $rc -eq 5 ]; then
  echo "no tests were collected: that is a failure" >&2
  exit 1
fi
exit $rc
