#!/usr/bin/env bash
# Install mtgpu with its test tools, then run the whole test suite (as root: the
# tests create Linux users, cgroups and real server processes, and remove them).
#
# With no arguments the unit tests (CPU-bound, about 30 s) run in a second pytest, and
# the VS Code extension's checks (clients/vscode/ci.sh: npm ci, type-check, node --test
# against a real node, vsce package; about 45 s) beside the integration tests, which
# mostly wait on real processes; their output follows the integration tests'. With
# arguments: one pytest with them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
VENV=${MTGPU_VENV:-/opt/mtgpu/venv}
PYTEST=("$VENV/bin/python" -m pytest -q -p no:cacheprovider)

no_tests() {
  echo "no tests were collected: that is a failure" >&2
  exit 1
}

set +e
if [ $# -gt 0 ]; then
  "${PYTEST[@]}" --durations=25 "$@"
  rc=$?
  [ $rc -eq 5 ] && no_tests
  exit $rc
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"${PYTEST[@]}" tests/unit > "$out/unit.log" 2>&1 &
unit_pid=$!
MTGPU_VENV="$VENV" bash clients/vscode/ci.sh > "$out/vscode.log" 2>&1 &
vscode_pid=$!
"${PYTEST[@]}" --durations=25 tests/integration
integration_rc=$?
wait "$vscode_pid"
vscode_rc=$?
wait "$unit_pid"
unit_rc=$?
echo
echo "---- the VS Code extension (clients/vscode/ci.sh, run beside the integration tests) ----"
cat "$out/vscode.log"
echo
echo "---- unit tests (run beside the integration tests) ----"
cat "$out/unit.log"
set -e
if [ $integration_rc -eq 5 ] || [ $unit_rc -eq 5 ]; then
  no_tests
fi
[ $integration_rc -eq 0 ] && [ $unit_rc -eq 0 ] && [ $vscode_rc -eq 0 ] && exit 0
echo "failed: integration tests exit $integration_rc, unit tests exit $unit_rc, VS Code extension exit $vscode_rc" >&2
exit 1
