#!/usr/bin/env bash
# Install mtgpu with its test tools, then run the whole test suite (as root: the
# tests create Linux users, cgroups and real server processes, and remove them).
#
# With no arguments the integration tests, which mostly wait on real processes, run in three
# pytest processes side by side: the cluster ones (Raft, partitions, clock jumps, DirectLink
# through NAT labs) with the others that start no container (CLUSTER_TESTS below), the
# workspace and DirectLink-member ones (WORKSPACE_TESTS: Podman workspaces, devcontainers,
# tunnels), and all the others (jobs in containers, isolation, install, the CLI). Every test
# keeps to its own uid range, ports, namespaces, chains and STATE_DIR-keyed names, so they
# never meet. Beside them, at a lower CPU priority (they are CPU-bound and wait for nothing),
# the unit tests and the VS Code extension's checks (clients/vscode/ci.sh: npm ci,
# type-check, node --test against a real node, vsce package). Each part's output is printed
# whole, one after the other. With arguments: one pytest with them.
#
# MTGPU_TEST_LOAD=N runs N CPU-spinning processes beside it all (bench/hog.py: bounded to an
# hour, killed by pid when this script ends), so the suite is shown to pass on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --test
VENV=${MTGPU_VENV:-/opt/mtgpu/venv}
# Every server and command the tests start imports mtgpu from this checkout (PYTHONPATH):
# with PYTHONDONTWRITEBYTECODE set (as in this project's machines' environment) each compiled some 110
# modules again, 0.35 s of CPU per server start, minutes over the suite. Keep the bytecode
# (__pycache__ is ignored by git), compiled once here rather than by the first processes at once.
unset PYTHONDONTWRITEBYTECODE
"$VENV/bin/python" -m compileall -q -j 2 mtgpu tests bench > /dev/null || true
PYTEST=("$VENV/bin/python" -m pytest -q -p no:cacheprovider)
LOAD=${MTGPU_TEST_LOAD:-0}
if ! [[ "$LOAD" =~ ^[0-9]+$ ]]; then
  echo "MTGPU_TEST_LOAD=$LOAD: give a whole number of CPU-spinning processes to run beside the tests (e.g. 2), or 0" >&2
  exit 2
fi
hog_pid=""
out=""
printed=0
cleanup() {
  if [ -n "$hog_pid" ]; then kill "$hog_pid" 2>/dev/null || true; wait "$hog_pid" 2>/dev/null || true; fi
  if [ -n "$out" ]; then
    # stopped before the parts' output was printed (a signal, a time limit): print what they wrote
    if [ "$printed" = 0 ]; then
      for f in "$out"/*.log; do [ -e "$f" ] && { echo "---- $(basename "$f") (interrupted) ----"; cat "$f"; }; done
    fi
    rm -rf "$out"
  fi
}
trap cleanup EXIT
if [ "$LOAD" -gt 0 ]; then
  "$VENV/bin/python" bench/hog.py --cpus "$LOAD" --seconds 3600 &
  hog_pid=$!
  echo "MTGPU_TEST_LOAD=$LOAD: $LOAD CPU-spinning processes run beside the tests (bench/hog.py, pid $hog_pid)"
fi

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

CLUSTER_TESTS=(test_cluster test_busy_members test_partitions test_clock_jump test_raft_roles test_startup_faults
               test_directlink_cluster test_directlink_nat test_directlink_admin test_fuzz
               # and others, so that the three parts take about as long (on 2 cores, 2026-12-03:
               # about 12 minutes each, all three and the unit tests sharing the CPUs)
               test_tenants test_logs test_metrics test_storage test_supervisor_death test_tui test_usage
               test_report_protocol test_container_registry
               test_upgrade_cluster)
# the Podman workspaces and the DirectLink tests that reach a member's workspace or sshd
WORKSPACE_TESTS=(test_workspaces test_devcontainer_templates test_workspace_mounts test_workspace_ssh
                 test_workspace_lifecycle test_node_files_sealed test_tui_workspace_wait
                 test_directlink_member test_directlink_sessions test_directlink_client test_directlink_quiet
                 test_directlink_join
                 # and one without containers, so that the three parts take about as long (a loaded
                 # run, 2026-12-04: 1236 s for the others, 1011 s for the cluster part, 962 s for this one)
                 test_queue_order)
cluster_files=()
workspace_files=()
other_files=()
for f in tests/integration/test_*.py; do
  name=$(basename "$f" .py)
  if [[ " ${CLUSTER_TESTS[*]} " == *" $name "* ]]; then cluster_files+=("$f")
  elif [[ " ${WORKSPACE_TESTS[*]} " == *" $name "* ]]; then workspace_files+=("$f")
  else other_files+=("$f"); fi
done

out=$(mktemp -d)
nice -n 10 "${PYTEST[@]}" tests/unit > "$out/unit.log" 2>&1 &
unit_pid=$!
MTGPU_VENV="$VENV" nice -n 10 bash clients/vscode/ci.sh > "$out/vscode.log" 2>&1 &
vscode_pid=$!
"${PYTEST[@]}" --durations=15 "${cluster_files[@]}" > "$out/cluster.log" 2>&1 &
cluster_pid=$!
"${PYTEST[@]}" --durations=15 "${workspace_files[@]}" > "$out/workspace.log" 2>&1 &
workspace_pid=$!
"${PYTEST[@]}" --durations=15 "${other_files[@]}"
other_rc=$?
wait "$cluster_pid"
cluster_rc=$?
wait "$workspace_pid"
workspace_rc=$?
wait "$vscode_pid"
vscode_rc=$?
wait "$unit_pid"
unit_rc=$?
printed=1
echo
echo "---- the cluster integration tests and the others without containers (${CLUSTER_TESTS[*]}), run beside the Podman ones ----"
cat "$out/cluster.log"
echo
echo "---- the workspace and DirectLink-member integration tests (${WORKSPACE_TESTS[*]}), run beside the others ----"
cat "$out/workspace.log"
echo
echo "---- the VS Code extension (clients/vscode/ci.sh, run beside the integration tests) ----"
cat "$out/vscode.log"
echo
echo "---- unit tests (run beside the integration tests) ----"
cat "$out/unit.log"
set -e
if [ $other_rc -eq 5 ] || [ $cluster_rc -eq 5 ] || [ $workspace_rc -eq 5 ] || [ $unit_rc -eq 5 ]; then
  no_tests
fi
[ $other_rc -eq 0 ] && [ $cluster_rc -eq 0 ] && [ $workspace_rc -eq 0 ] && [ $unit_rc -eq 0 ] && [ $vscode_rc -eq 0 ] && exit 0
echo "failed: integration tests exit $other_rc, cluster integration tests exit $cluster_rc," \
     "workspace integration tests exit $workspace_rc, unit tests exit $unit_rc," \
     "VS Code extension exit $vscode_rc" >&2
exit 1
