#!/usr/bin/env bash
# One end-to-end check of a real standalone mtgpu node on a machine with a real NVIDIA GPU
# (written for the device machine: one H200, root, python3 = /opt/torch/.venv/bin/python3 with
# torch, no network). Run from the repository root with OUT set to an output folder:
#
#   OUT=/some/dir bash bench/gpu_check.sh
#
# Steps (each prints PASS or FAIL; a summary at the end; exit status 1 when any failed):
#   1 install   the wheels in .whl (mtgpu, mtgpu-client and the dependencies the machine lacks)
#               into /tmp/site (PYTHONPATH), then print the versions: python, torch, GPUs, driver
#   2 node      start mtgpu-server (a temporary STATE_DIR, GPU_BACKEND = "auto": real NVML)
#   3 gpus      what the node sees: `mtgpu-admin nodes` (model, VRAM, live use), checked against
#               nvidia-smi
#   4 tenant    `mtgpu-admin tenant invite` + `remotegpu-cli join`: the node creates the account
#     python    the tenant can run /opt/torch/.venv/bin/python3 and reach CUDA with a job's clean
#               environment (if not: says why, works around it, and this step FAILs)
#     job       as the tenant, `mt-job submit` a `#MTGPU gpus=1 vram=20G` job: torch on the GPU,
#               ~16 GiB held, bf16 matmuls (TFLOP/s); state, exit code and log
#     telemetry while it runs, `mtgpu-admin nodes --json` must show the job's memory on the GPU
#   5 refusal   `gpus=1 vram=500G` is refused at submit (exit status 2, with the reason)
#   6 fence     a CPU-only job (cpus=1 mem=2G) cannot open /dev/nvidia0, and its cgroup says
#               memory.max 2 GiB (SKIP in the dry run where there is no /dev/nvidia0)
#   7 cleanup   (always, also on failure or timeout) job cancelled, tenant removed, server stopped,
#               temporary folders removed
# Everything ends within MTGPU_CHECK_BUDGET_S (default 290 s) plus at most ~60 s of cleanup. $OUT gets at most 7 files:
# check.log (this output), server.log, nodes.txt, poll.tsv, job.json, job.log, summary.txt.
#
# Local dry run without a GPU (the mechanics, not the GPU): GPU_BACKEND = "simulated" with one
# simulated H200, a stand-in job without torch, the telemetry fed by `mtgpu-admin simulate-load`,
# commands from the installed /opt/mtgpu/venv (no wheel install):
#
#   MTGPU_CHECK_SIMULATED=1 OUT=/tmp/gpucheck-out bash bench/gpu_check.sh
#
# Other knobs: MTGPU_CHECK_INSTALL=0|1 (install .whl: default 1 on a GPU, 0 simulated),
# MTGPU_CHECK_SITE (default /tmp/site), MTGPU_CHECK_BIN (where the commands are),
# MTGPU_CHECK_JOB_PYTHON (default /opt/torch/.venv/bin/python3).
#
# The mtgpu and mtgpu-client wheels in .whl are a snapshot: rebuild them from the commit to
# test (step 1 says when the installed mtgpu differs from this working tree):
#   rm -f .whl/mtgpu-*.whl .whl/mtgpu_client-*.whl; T=$(mktemp -d); git archive HEAD | tar -x -C "$T"
#   (cd "$T" && /opt/mtgpu/venv/bin/python -m pip wheel -q --no-deps -w "$OLDPWD/.whl" ./clients/python .); rm -rf "$T"

set -u -o pipefail
umask 022

: "${OUT:?set OUT to the output folder}"
SIM=${MTGPU_CHECK_SIMULATED:-0}
BUDGET_S=${MTGPU_CHECK_BUDGET_S:-290}
REPO=$(cd "$(dirname "$0")/.." && pwd)
START_S=$(date +%s)
mkdir -p "$OUT"
: > "$OUT/check.log"
exec > >(tee -a "$OUT/check.log") 2>&1
TEE_PID=$!
exec 7>&1   # the log again, for the EXIT trap: a signal can land while a command's output is redirected

if [ "$SIM" = 1 ]; then
  INSTALL=${MTGPU_CHECK_INSTALL:-0}
  DEFAULT_BIN=/opt/mtgpu/venv/bin
  JOB_PY=${MTGPU_CHECK_JOB_PYTHON:-/opt/mtgpu/venv/bin/python}
else
  INSTALL=${MTGPU_CHECK_INSTALL:-1}
  DEFAULT_BIN=${MTGPU_CHECK_SITE:-/tmp/site}/bin
  JOB_PY=${MTGPU_CHECK_JOB_PYTHON:-/opt/torch/.venv/bin/python3}
fi
SITE=${MTGPU_CHECK_SITE:-/tmp/site}
BACKEND=${MTGPU_CHECK_GPU_BACKEND:-$([ "$SIM" = 1 ] && echo simulated || echo auto)}  # for testing this script
BIN=${MTGPU_CHECK_BIN:-$DEFAULT_BIN}
TENANT_PYTHONPATH=""   # what tenants' commands need on PYTHONPATH (the wheels' folder on the device)

# ------------------------------------------------------------------ bookkeeping
STEPS=()
RESULTS=()
record() {  # record STEP PASS|FAIL DETAIL
  STEPS+=("$1"); RESULTS+=("$2 $1: $3")
  echo "$2 [$1] $3"
}
elapsed() { echo $(( $(date +%s) - START_S )); }
left_s() { echo $(( BUDGET_S - ($(date +%s) - START_S) )); }
banner() { echo; echo "==== [$(elapsed)s] $*"; }
human() { awk -v b="${1:-0}" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }

WORK=""
SERVER_PID=""
JOB_ID=""
JOB_DONE=0
TNAME=""
TUID=""
TGID=""
THOME=""
TENANT_BY_NODE=0
TENANT_BY_USERADD=0
TENANT_GROUP_EXISTED=1
WATCHDOG_PID=""
CLEANED=0
CG_PARENT=""   # the node's own cgroup folders are named after it (mtgpu/agent/runners/cgroups.py)

# The watchdog: after BUDGET_S the check is stopped (SIGTERM to this shell), then cleans up (<= ~60 s).
(
  sleep "$BUDGET_S" & sp=$!
  trap 'kill $sp 2>/dev/null; exit 0' TERM
  wait $sp
  echo "WATCHDOG: ${BUDGET_S}s budget spent; stopping the check"
  kill -TERM $$ 2>/dev/null
) &
WATCHDOG_PID=$!

admin() { timeout "${T:-40}" env ${TENANT_PYTHONPATH:+PYTHONPATH=$TENANT_PYTHONPATH} MTGPU_CONFIG="$CFG" HOME=/root COLUMNS=160 "$BIN/mtgpu-admin" "$@"; }
as_tenant() {  # run a command as the tenant, with a clean environment, in its home
  (cd "$THOME" && timeout "${T:-40}" setpriv --reuid="$TUID" --regid="$TGID" --init-groups \
     env -i PATH="$BIN:/usr/local/bin:/usr/bin:/bin" HOME="$THOME" USER="$TNAME" LOGNAME="$TNAME" LANG=C.UTF-8 \
     COLUMNS=160 MTGPU_SOCKET="$SOCK" ${TENANT_PYTHONPATH:+PYTHONPATH=$TENANT_PYTHONPATH} "$@")
}
json() { "$PY" -c "import json,sys; d=json.load(sys.stdin); $1"; }

cleanup() {
  [ "$CLEANED" = 1 ] && return
  CLEANED=1
  trap '' INT TERM
  banner "6 cleanup"
  local ok=1 why=""
  if [ -n "$TUID" ] && [ "$JOB_DONE" != 1 ] && [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    # the tenant's jobs still queued or running (also one submitted just before an interruption)
    local active
    active=$(T=15 as_tenant "$BIN/mt-job" list --active --json 2>/dev/null | json 'print(" ".join(str(j["id"]) for j in d))' 2>/dev/null)
    for j in $active; do echo "cancelling job $j"; T=15 as_tenant "$BIN/mt-job" cancel "$j"; done
    if [ -n "$active" ]; then  # the node records their end (and removes their cgroups) before it stops
      for _ in $(seq 1 8); do
        [ -z "$(T=10 as_tenant "$BIN/mt-job" list --active --json 2>/dev/null | json 'print(" ".join(str(j["id"]) for j in d))' 2>/dev/null)" ] && break
        sleep 1
      done
    fi
  fi
  if [ "$TENANT_BY_NODE" = 1 ] && [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "removing tenant $TNAME through the node"
    T=20 admin tenant remove "$TNAME" || true
    for _ in $(seq 1 20); do getent passwd "$TNAME" >/dev/null || break; sleep 0.5; done
    if getent passwd "$TNAME" >/dev/null; then echo "the node did not remove the account $TNAME"; fi
  fi
  if [ -n "$SERVER_PID" ]; then
    echo "stopping mtgpu-server (pid $SERVER_PID)"
    kill -TERM "$SERVER_PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "mtgpu-server did not stop in 15 s: SIGKILL"; kill -KILL "$SERVER_PID" 2>/dev/null; ok=0; why="server needed SIGKILL; "
    fi
    wait "$SERVER_PID" 2>/dev/null
  fi
  # processes left that this check started: job supervisors (their command line names our folder)
  # and anything still running as the check's tenant
  if [ -n "$WORK" ]; then
    local left
    left=$(pgrep -f -- "$WORK" | grep -vx "$$" | tr '\n' ' ')
    if [ -n "$TUID" ] && [ "$TUID" != 0 ]; then left="$left $(pgrep -u "$TUID" | tr '\n' ' ')"; fi
    left=$(echo $left)
    if [ -n "$left" ]; then
      echo "processes left: $left: killing them"; ps -o pid,user,args -p "${left// /,}" 2>/dev/null
      kill -KILL $left 2>/dev/null; ok=0; why="${why}processes left ($left); "
    fi
  fi
  if [ -n "$CG_PARENT" ]; then  # cgroup folders the node left (after an interruption): empty ones go
    local cgs n_cg
    cgs=$(find /sys/fs/cgroup -maxdepth 7 -depth -type d -path "*/$CG_PARENT*" 2>/dev/null)
    if [ -n "$cgs" ]; then
      n_cg=$(echo "$cgs" | wc -l)
      echo "$cgs" | while read -r d; do rmdir "$d" 2>/dev/null; done
      cgs=$(find /sys/fs/cgroup -maxdepth 7 -depth -type d -path "*/$CG_PARENT*" 2>/dev/null)
      echo "the node left $n_cg cgroup folder(s) named $CG_PARENT*; $(echo "$cgs" | grep -c .) remain"
      # cgroup v2: the processes that shared the node's group (this script, the shell that ran
      # it) were moved into <group>-neighbours (agent/runners/cgroups.py) and outlive the node
      local kept="" d
      for d in $cgs; do
        case "$d" in *-neighbours) [ -n "$(cat "$d/cgroup.procs" 2>/dev/null)" ] && kept="$kept $d" && cgs=$(echo "$cgs" | grep -vx "$d");; esac
      done
      [ -n "$kept" ] && echo "kept (its processes, this check's own shells, still live):$kept"
      if [ -n "$cgs" ]; then ok=0; why="${why}cgroup folders left: $(echo $cgs | cut -c1-200); "; fi
    fi
  fi
  if [ -n "$TNAME" ] && { [ "$TENANT_BY_NODE" = 1 ] || [ "$TENANT_BY_USERADD" = 1 ]; } && getent passwd "$TNAME" >/dev/null; then
    echo "removing account $TNAME with userdel"
    userdel -r -f "$TNAME" 2>&1 | grep -v "mail spool" ; getent group "$TNAME" >/dev/null && groupdel "$TNAME"
    [ "$TENANT_BY_NODE" = 1 ] && { ok=0; why="${why}the node left the account $TNAME; "; }
  fi
  if [ "$TENANT_GROUP_EXISTED" = 0 ] && getent group mtgpu-tenants >/dev/null \
     && [ -z "$(getent group mtgpu-tenants | cut -d: -f4)" ]; then
    echo "removing the group mtgpu-tenants (created by this check)"; groupdel mtgpu-tenants
  fi
  if [ -n "$WORK" ] && [ -d "$WORK" ]; then rm -rf "$WORK"; fi
  [ -n "$WATCHDOG_PID" ] && kill -TERM "$WATCHDOG_PID" 2>/dev/null && wait "$WATCHDOG_PID" 2>/dev/null
  local did="nothing to clean"
  [ -n "$SERVER_PID" ] && did="server stopped"
  [ -n "$TNAME" ] && did="$did, tenant $TNAME removed"
  [ -n "$WORK" ] && did="$did, $WORK removed"
  if [ $ok = 1 ]; then record cleanup PASS "$did"
  else record cleanup FAIL "${why%; }"; fi

  banner "summary ($(elapsed)s)"
  local failed=0
  for r in "${RESULTS[@]}"; do echo "$r"; case "$r" in FAIL*) failed=$((failed + 1));; esac; done
  for s in install node gpus tenant python job telemetry refusal fence; do
    case " ${STEPS[*]} " in *" $s "*) ;; *) echo "FAIL $s: not reached"; failed=$((failed + 1));; esac
  done
  local mode="real GPU"; [ "$SIM" = 1 ] && mode="SIMULATED GPU (dry run)"
  if [ $failed = 0 ]; then echo "OVERALL: PASS ($mode, $(elapsed)s)"; else echo "OVERALL: FAIL, $failed step(s) ($mode, $(elapsed)s)"; fi
  { for r in "${RESULTS[@]}"; do echo "$r"; done
    if [ $failed = 0 ]; then echo "OVERALL: PASS ($mode)"; else echo "OVERALL: FAIL $failed ($mode)"; fi; } > "$OUT/summary.txt"
  EXIT_RC=$(( failed > 0 ? 1 : 0 ))
}
on_exit() {
  exec 0</dev/null 1>&7 2>&7
  cleanup
  # close every copy of the pipe to tee (bash keeps saved copies while a redirection is active), let
  # tee write the rest and end; never wait for it for long
  local pipe fd
  pipe=$(readlink "/proc/$$/fd/7")
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    [ "$(readlink "/proc/$$/fd/$fd" 2>/dev/null)" = "$pipe" ] && eval "exec $fd>&-"
  done
  for _ in $(seq 1 30); do kill -0 "$TEE_PID" 2>/dev/null || break; sleep 0.1; done
  kill "$TEE_PID" 2>/dev/null
  exit "${EXIT_RC:-1}"
}
trap on_exit EXIT
trap 'echo "interrupted (signal)"; exit 1' INT TERM

# ------------------------------------------------------------------ 1 install and versions
banner "1 install and versions (mode: $([ "$SIM" = 1 ] && echo simulated || echo real GPU))"
ok=1; detail=""
if [ "$INSTALL" = 1 ]; then
  n=$(ls "$REPO"/.whl/*.whl 2>/dev/null | wc -l)
  echo "installing $n wheels from .whl into $SITE"
  if timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
       --target "$SITE" "$REPO"/.whl/*.whl; then
    chmod -R a+rX "$SITE"
    # compiled once here (root), so each command below does not compile its imports again
    timeout 90 python3 -m compileall -q -j 0 "$SITE" >/dev/null 2>&1 || echo "(compileall did not finish; commands start slower)"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    TENANT_PYTHONPATH=$SITE
    detail="$n wheels into $SITE"
  else
    ok=0; detail="pip install from .whl failed"
  fi
fi
PY=$(head -1 "$BIN/mtgpu-server" 2>/dev/null | sed -n 's/^#!//p' | awk '{print $1}')
[ -x "${PY:-}" ] || PY=$(command -v python3)
echo "python (commands): $PY: $("$PY" -V 2>&1)"
echo "python3 on PATH: $(command -v python3): $(python3 -V 2>&1)"
echo "commands from: $BIN"
if ! [ -x "$BIN/mtgpu-server" ]; then ok=0; detail="$detail; $BIN/mtgpu-server missing"; fi
mt_v=$(cd / && timeout 30 "$PY" -c 'import mtgpu, pydantic, fastapi, pysyncobj, typer, rich, textual, sys; print(mtgpu.__file__, "pydantic", pydantic.VERSION, "fastapi", fastapi.__version__, "typer", typer.__version__)' 2>&1) \
  || { ok=0; detail="$detail; imports failed"; }
echo "mtgpu and its dependencies: $mt_v"
if [ "$INSTALL" = 1 ] && [ -d "$SITE/mtgpu" ]; then  # is the installed mtgpu this working tree's?
  diffs=$(cd "$REPO" && for f in $(find mtgpu -name '*.py' -o -name '*.html' -o -name '*.txt' | sort); do
            cmp -s "$f" "$SITE/$f" || echo "$f"; done)
  if [ -z "$diffs" ]; then echo "the installed mtgpu matches this working tree's mtgpu/"
  else echo "NOTE: the installed mtgpu (wheels in .whl) differs from this working tree in $(echo "$diffs" | wc -l) file(s): $(echo $diffs | cut -c1-300)"; fi
fi
if [ "$SIM" != 1 ]; then
  echo "torch: $(cd / && timeout 90 env -u PYTHONPATH "$JOB_PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1 | tail -1)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi -L
    timeout 20 nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,utilization.gpu --format=csv
  else
    ok=0; detail="$detail; nvidia-smi not found"
  fi
else
  echo "torch / nvidia-smi: not used in the simulated dry run"
fi
echo "kernel: $(uname -r); cgroup: $(stat -fc %T /sys/fs/cgroup 2>/dev/null); user: $(id -un)"
[ $ok = 1 ] && record install PASS "${detail:-no install (MTGPU_CHECK_INSTALL=0): commands from $BIN}" || record install FAIL "$detail"
[ $ok = 1 ] || exit 1

# ------------------------------------------------------------------ 2 the node
banner "2 start a standalone node"
WORK=$(mktemp -d /tmp/mtgpu-gpucheck.XXXXXX)
chmod 755 "$WORK"
CFG=$WORK/mtgpu.toml
SOCK=$WORK/state/mtgpu.sock
ports=$("$PY" -c 'import socket
ss=[socket.socket() for _ in range(2)]
[s.bind(("127.0.0.1",0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])')
read -r PORT SSH_PORT <<< "$ports"
uid_base=271000   # tenants' ids: a range no account here uses
while getent passwd "$uid_base" >/dev/null || getent group "$uid_base" >/dev/null; do uid_base=$((uid_base + 1000)); done
getent group mtgpu-tenants >/dev/null || TENANT_GROUP_EXISTED=0
{
  echo "# written by bench/gpu_check.sh: a throw-away standalone node"
  echo 'CLUSTER_MODE = "standalone"'
  echo 'NODE_NAME = "gpu-check"'
  echo "LISTEN = \"127.0.0.1:$PORT\""
  echo "STATE_DIR = \"$WORK/state\""
  echo "TENANT_HOME_ROOT = \"$WORK/homes\""
  echo "TENANT_UID_RANGE = [$uid_base, $((uid_base + 999))]"
  echo 'PERSISTENT_TERMINALS = "off"   # no tmux needed'
  echo "SSH_LISTEN = \"127.0.0.1:$SSH_PORT\"   # the tenant sshd, if this machine has one"
  echo "GPU_BACKEND = \"$BACKEND\""
  echo
  echo '[DIRECTLINK]'
  echo 'enabled = false'
  if [ "$BACKEND" = simulated ]; then
    echo
    echo '[[SIMULATED_GPUS]]'
    echo 'model = "NVIDIA H200"'
    echo 'vendor = "nvidia"'
    echo 'vram = "143771MiB"'
    echo 'count = 1'
  fi
} > "$CFG"
echo "config $CFG:"; sed 's/^/  | /' "$CFG"
CG_PARENT=$(cd / && "$PY" -c 'import sys; from mtgpu.agent.runners.cgroups import parent_for; print(parent_for(sys.argv[1], sys.argv[2]))' \
            gpu-check "$WORK/state" 2>/dev/null)
echo "the node's cgroup folders will be named ${CG_PARENT:-?}*"
: > "$OUT/server.log"
"$BIN/mtgpu-server" --config "$CFG" >> "$OUT/server.log" 2>&1 7>&- &
SERVER_PID=$!
echo "mtgpu-server started, pid $SERVER_PID, log $OUT/server.log"
up=0; t_up=$(date +%s); until_s=$(( t_up + 60 ))
while [ "$(date +%s)" -lt "$until_s" ]; do
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "mtgpu-server exited"; break; fi
  if [ -S "$SOCK" ] && T=15 admin nodes --json > "$WORK/nodes.json" 2> "$WORK/admin.err" \
     && json 'sys.exit(0 if d and d[0].get("state") == "up" else 1)' < "$WORK/nodes.json"; then up=1; break; fi
  sleep 1
done
grep -E "GPU_BACKEND|serving on|schedules now|ERROR|Traceback" "$OUT/server.log" | head -20 | sed 's/^/  log| /'
if [ $up = 1 ]; then record node PASS "answers (mtgpu-admin nodes: up) $(( $(date +%s) - t_up ))s after its start (pid $SERVER_PID)"
else
  record node FAIL "no answer from the node within 60 s of its start"
  echo "--- the last mtgpu-admin nodes error:"; tail -25 "$WORK/admin.err" 2>/dev/null
  echo "--- server.log:"; tail -40 "$OUT/server.log"; exit 1
fi

# ------------------------------------------------------------------ 3 what the node sees
banner "3 what the node sees"
# the first telemetry sample may come a second after the node is up
for _ in $(seq 1 15); do
  T=20 admin nodes --json > "$WORK/nodes.json" && json 'sys.exit(0 if d[0].get("gpus") else 1)' < "$WORK/nodes.json" && break
  sleep 1
done
{ echo "\$ mtgpu-admin nodes"; T=20 admin nodes; echo; echo "\$ mtgpu-admin nodes --json"; cat "$WORK/nodes.json"
  if [ "$SIM" != 1 ]; then echo; echo "\$ nvidia-smi"; timeout 20 nvidia-smi; fi; } > "$OUT/nodes.txt" 2>&1
sed -n '1,/^\$ mtgpu-admin nodes --json/p' "$OUT/nodes.txt" | head -n -1
NODE_GPU=$(json '
g = d[0]["gpus"]
for x in g:
    print("GPU %d: %s (%s), VRAM %.1f GiB total, %.2f GiB used, util %.0f%%" % (x["index"], x["model"], x["vendor"],
          x["vram_total_bytes"] / 2**30, x["vram_used_bytes"] / 2**30, x["utilization_pct"]))
' < "$WORK/nodes.json")
echo "the node sees: ${NODE_GPU:-no GPU}"
MODEL=$(json 'print(d[0]["gpus"][0]["model"] if d[0]["gpus"] else "")' < "$WORK/nodes.json")
VRAM_TOTAL=$(json 'print(d[0]["gpus"][0]["vram_total_bytes"] if d[0]["gpus"] else 0)' < "$WORK/nodes.json")
if [ -z "$MODEL" ]; then
  record gpus FAIL "the node lists no GPU (server.log says which backend it chose)"
elif [ "$SIM" = 1 ]; then
  record gpus PASS "$MODEL, $(human "$VRAM_TOTAL") (simulated)"
else
  smi_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -1)
  smi_total=$(timeout 20 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  echo "nvidia-smi says: $smi_name, ${smi_total} MiB"
  if [ "$MODEL" = "$smi_name" ] && [ $(( VRAM_TOTAL / 1048576 )) -ge $(( ${smi_total:-0} - 1 )) ] \
     && [ $(( VRAM_TOTAL / 1048576 )) -le $(( ${smi_total:-0} + 1 )) ]; then
    record gpus PASS "$MODEL, $(human "$VRAM_TOTAL"), as nvidia-smi says"
  else
    record gpus FAIL "node: '$MODEL' $(( VRAM_TOTAL / 1048576 )) MiB, nvidia-smi: '$smi_name' ${smi_total} MiB"
  fi
fi

# ------------------------------------------------------------------ 4 a tenant's GPU job
banner "4a a tenant: invited, joined; the node creates the account"
TNAME=gpuchk$(( RANDOM % 9000 + 1000 ))
while getent passwd "$TNAME" >/dev/null; do TNAME=gpuchk$(( RANDOM % 9000 + 1000 )); done
inv=$(T=30 admin tenant invite "$TNAME" --json | json 'print(d["invitation"])')
mkdir -p "$WORK/laptop"
echo "\$ remotegpu-cli join <invitation>    # as $TNAME's laptop (HOME=$WORK/laptop)"
if [ -n "$inv" ] && (cd "$WORK/laptop" && timeout 40 env -i PATH="$BIN:/usr/bin:/bin" HOME="$WORK/laptop" LANG=C.UTF-8 \
      ${TENANT_PYTHONPATH:+PYTHONPATH=$TENANT_PYTHONPATH} "$BIN/remotegpu-cli" join "$inv" --json); then
  TENANT_BY_NODE=1
fi
for _ in $(seq 1 40); do getent passwd "$TNAME" >/dev/null && [ -d "$WORK/homes/$TNAME" ] && break; sleep 0.5; done
if getent passwd "$TNAME" >/dev/null && [ -d "$WORK/homes/$TNAME" ]; then
  TENANT_BY_NODE=1
  record tenant PASS "the node created $(getent passwd "$TNAME" | cut -d: -f1,3,4,6)"
else
  record tenant FAIL "no account $TNAME after invite and join (server.log); going on with a local user"
  grep -i "accounts" "$OUT/server.log" | tail -5
  useradd -m -d "$WORK/homes/$TNAME" -s /bin/bash "$TNAME" && TENANT_BY_USERADD=1
fi
TUID=$(id -u "$TNAME"); TGID=$(id -g "$TNAME"); THOME=$(getent passwd "$TNAME" | cut -d: -f6)

banner "4b the tenant can run $JOB_PY (with a job's clean environment)"
probe='import sys, os
print("python", sys.version.split()[0], sys.executable)
try:
    import torch
except Exception as e:
    print("no torch:", e); sys.exit(0 if os.environ.get("SIMCHECK") else 3)
print("torch", torch.__version__, "cuda available:", torch.cuda.is_available())
sys.exit(0 if torch.cuda.is_available() else 4)'
EXTRA_ENV=""
SIMENV=(); [ "$SIM" = 1 ] && SIMENV=(env SIMCHECK=1)
run_probe() { TENANT_PYTHONPATH="" T=120 as_tenant "${SIMENV[@]}" "$@" "$JOB_PY" -c "$probe"; }  # no PYTHONPATH: as a job
if out=$(run_probe 2>&1); then
  echo "$out"; record python PASS "$TNAME runs $JOB_PY: $(echo "$out" | tail -1)"
else
  rc=$?; echo "$out"
  why="$TNAME cannot use $JOB_PY (status $rc)"
  echo "why: the path as the tenant sees it:"; namei -l "$JOB_PY" 2>&1 | sed 's/^/  /'
  real=$(readlink -f "$JOB_PY"); echo "it resolves to $real"; namei -l "$real" 2>&1 | sed 's/^/  /'
  echo "the GPU device files:"; ls -la /dev/nvidia* 2>&1 | head -8 | sed 's/^/  /'
  if [ $rc = 4 ] && [ -n "${LD_LIBRARY_PATH:-}" ] && out2=$(run_probe env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" 2>&1); then
    echo "$out2"
    why="$why: CUDA needs LD_LIBRARY_PATH=$LD_LIBRARY_PATH, which a job's clean environment lacks; the job file sets it"
    EXTRA_ENV="export LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  elif [ "$SIM" = 1 ]; then
    why="$why (dry run: no workaround tried here)"
  else
    echo "WORKAROUND (this machine is thrown away): making the folders on the way to $JOB_PY and $real traversable"
    for p in "$JOB_PY" "$real"; do d=$(dirname "$p"); while [ "$d" != / ]; do chmod o+rx "$d"; d=$(dirname "$d"); done; done
    chmod o+rx "$real"
    if out2=$(run_probe 2>&1); then echo "$out2"; why="$why; after chmod o+rx on its folders it can"
    elif [ -n "${LD_LIBRARY_PATH:-}" ] && out2=$(run_probe env LD_LIBRARY_PATH="$LD_LIBRARY_PATH" 2>&1); then
      echo "$out2"; why="$why; after chmod o+rx and with LD_LIBRARY_PATH it can"; EXTRA_ENV="export LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    else echo "$out2"; why="$why; not even after chmod o+rx on its folders"; fi
  fi
  record python FAIL "$why"
fi

banner "4c the tenant submits a GPU job"
JOB_FILE=$THOME/gpu_check_job.sh
{
  echo '#!/bin/bash'
  echo '#MTGPU gpus=1 vram=20G name=gpu-check time=4m'
  echo 'echo "job $MTGPU_JOB_ID on $MTGPU_NODE as $(id -un) (uid $(id -u)) in $(pwd)"'
  echo 'echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"'
  echo 'env | grep "^MTGPU_" | grep -v TOKEN | sort'
  [ -n "$EXTRA_ENV" ] && echo "$EXTRA_ENV   # added by gpu_check.sh: see step 4b"
  if [ "$SIM" = 1 ]; then
    cat <<'EOF'
# the dry run's stand-in for the torch program below (no GPU here)
echo "device 0: (simulated: no torch in the dry run)"
echo "MARK allocated 16.0 GiB (stand-in)"
sleep 4
echo "bf16 matmul: (stand-in) 0.0 TFLOP/s"
echo "MARK holding"
sleep 8
echo "MARK done"
EOF
  else
    echo "exec $JOB_PY -u - <<'PY'"
    cat <<'EOF'
import os, time, torch
GiB = 2**30
print("torch", torch.__version__, "cuda", torch.version.cuda, "available:", torch.cuda.is_available())
print("device 0:", torch.cuda.get_device_name(0), "| devices visible:", torch.cuda.device_count())
print("CUDA_VISIBLE_DEVICES =", os.environ.get("CUDA_VISIBLE_DEVICES"))
for k in sorted(os.environ):
    if k.startswith("MTGPU_") and "TOKEN" not in k:
        print(f"  {k}={os.environ[k]}")
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
ballast = torch.ones(int(15.6 * GiB), dtype=torch.uint8, device="cuda")   # touched: really resident
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"MARK allocated {torch.cuda.memory_allocated() / GiB:.1f} GiB; device free {free / GiB:.1f} of {total / GiB:.1f} GiB", flush=True)
for _ in range(5):
    torch.matmul(a, b, out=c)
torch.cuda.synchronize()
iters, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 5.0:
    for _ in range(50):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    iters += 50
dt = time.perf_counter() - t0
print(f"bf16 matmul {n}x{n}x{n}: {iters} in {dt:.2f} s = {2 * n**3 * iters / dt / 1e12:.1f} TFLOP/s", flush=True)
print("MARK holding", flush=True)
time.sleep(12)
print("MARK done", float(c[0, 0]), int(ballast[-1]))
PY
EOF
  fi
} > "$JOB_FILE"
chown "$TUID:$TGID" "$JOB_FILE"
echo "\$ cat $JOB_FILE"; sed 's/^/  | /' "$JOB_FILE"
echo "\$ mt-job submit --json gpu_check_job.sh    # as $TNAME (uid $TUID)"
sub=$(T=40 as_tenant "$BIN/mt-job" submit --json gpu_check_job.sh 2>&1); sub_rc=$?
echo "$sub"
JOB_ID=$(echo "$sub" | json 'print(d["job_id"])' 2>/dev/null)
if [ $sub_rc != 0 ] || [ -z "$JOB_ID" ]; then
  record job FAIL "submit failed (status $sub_rc)"
  record telemetry FAIL "no job to watch"
else
  banner "4d while job $JOB_ID runs: the node's telemetry (mtgpu-admin nodes --json) and the job's state"
  printf 'elapsed_s\tjob_state\tnode_vram_used_bytes\tnode_util_pct\tsmi_used_mib\tsmi_util_pct\n' > "$OUT/poll.tsv"
  max_used=0; max_state_used=0; state=""; sim_loaded=0; deadline=$(( $(date +%s) + 200 ))
  [ $(( $(left_s) - 45 )) -lt 200 ] && deadline=$(( $(date +%s) + $(left_s) - 45 ))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    T=20 admin nodes --json > "$WORK/poll-nodes.json" 2>/dev/null &
    p1=$!
    T=20 as_tenant "$BIN/mt-job" show "$JOB_ID" --json > "$WORK/poll-job.json" 2>/dev/null &
    p2=$!
    smi="-,-"
    [ "$SIM" != 1 ] && smi=$(timeout 10 nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader,nounits -i 0 2>/dev/null | tr -d ' ')
    wait $p1; wait $p2
    state=$(json 'print(d["state"])' < "$WORK/poll-job.json" 2>/dev/null)
    read -r used util <<< "$(json 'g=d[0]["gpus"][0]; print(g["vram_used_bytes"], g["utilization_pct"])' < "$WORK/poll-nodes.json" 2>/dev/null)"
    used=${used:-0}; util=${util:-?}
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$(elapsed)" "${state:-?}" "$used" "$util" "${smi%,*}" "${smi#*,}" >> "$OUT/poll.tsv"
    echo "[$(elapsed)s] job $JOB_ID: ${state:-?}; the node sees GPU 0: $(human "$used") used, util ${util}%$([ "$SIM" != 1 ] && echo "   (nvidia-smi: ${smi%,*} MiB, ${smi#*,}%)")"
    [ "$used" -gt "$max_used" ] 2>/dev/null && max_used=$used
    [ "$state" = running ] && [ "$used" -gt "$max_state_used" ] 2>/dev/null && max_state_used=$used
    if [ "$SIM" = 1 ] && [ "$state" = running ] && [ $sim_loaded = 0 ]; then
      echo "(dry run: the stand-in job uses no GPU; its memory is fed to the simulated backend)"
      T=20 admin simulate-load 0 --used 16.5G --util 97 && sim_loaded=1
    fi
    case "$state" in completed|failed|cancelled|lost) JOB_DONE=1; break;; esac
    sleep 1
  done
  [ "$SIM" = 1 ] && [ $sim_loaded = 1 ] && T=20 admin simulate-load 0 --used 0 --util 0
  T=20 as_tenant "$BIN/mt-job" show "$JOB_ID" --json > "$OUT/job.json" 2>&1
  T=30 as_tenant "$BIN/mt-job" logs "$JOB_ID" > "$OUT/job.log" 2>&1
  banner "job $JOB_ID ended: mt-job show / mt-job logs"
  json 'print("state:", d["state"], "| exit_code:", d["exit_code"], "| reason:", d["reason"] or "-", "| nodes:", d["nodes"], "| gpus:", d["gpus"])
print("enforced:", d.get("enforced")); print("usage:", d.get("usage"))' < "$OUT/job.json" || cat "$OUT/job.json"
  echo "--- job output (mt-job logs $JOB_ID):"; cat "$OUT/job.log"; echo "--- end of job output"
  jstate=$(json 'print(d["state"], d["exit_code"])' < "$OUT/job.json" 2>/dev/null)
  want="device 0: $MODEL"; [ "$SIM" = 1 ] && want="device 0: "
  if [ "$jstate" = "completed 0" ] && grep -q "MARK done" "$OUT/job.log" && grep -qF "$want" "$OUT/job.log" \
     && grep -q "TFLOP/s" "$OUT/job.log"; then
    record job PASS "completed, exit 0: $(grep -o '[0-9.]* TFLOP/s' "$OUT/job.log" | head -1) on $(grep '^device 0:' "$OUT/job.log" | head -1 | cut -c11-60)"
  else
    record job FAIL "state/exit: '${jstate:-?}' (wanted 'completed 0' and a log with the device, TFLOP/s and MARK done)"
  fi
  if [ "$max_state_used" -ge $(( 15 * 1073741824 )) ]; then
    record telemetry PASS "the node saw $(human "$max_state_used") used on GPU 0 while the job ran$([ "$SIM" = 1 ] && echo ' (simulated load)')"
  else
    record telemetry FAIL "the node saw at most $(human "$max_state_used") used while the job ran (wanted >= 15 GiB; poll.tsv)"
  fi
fi

# ------------------------------------------------------------------ 5 an impossible request
banner "5 an impossible request is refused at submit"
cat > "$THOME/impossible.sh" <<'EOF'
#!/bin/bash
#MTGPU gpus=1 vram=500G name=too-big
echo "this must never run"
EOF
chown "$TUID:$TGID" "$THOME/impossible.sh"
echo "\$ mt-job submit impossible.sh    # gpus=1 vram=500G, as $TNAME"
ref=$(T=40 as_tenant "$BIN/mt-job" submit impossible.sh 2>&1); ref_rc=$?
echo "$ref"; echo "(exit status $ref_rc)"
if [ $ref_rc = 2 ] && echo "$ref" | grep -qi "refused"; then record refusal PASS "exit 2: $(echo "$ref" | tail -1 | cut -c1-160)"
else record refusal FAIL "exit status $ref_rc (wanted 2 and the reason)"; fi

# ------------------------------------------------------------------ 6 a job without GPUs is fenced
banner "6 a CPU-only job (cpus=1 mem=2G): no GPU device node opens, its cgroup has its limits"
cat > "$THOME/fence.sh" <<EOF
#!/bin/bash
#MTGPU cpus=1 mem=2G name=fence time=2m
echo "cgroup: \$(tail -1 /proc/self/cgroup)"
cg=/sys/fs/cgroup\$(tail -1 /proc/self/cgroup | cut -d: -f3)
for f in memory.max cpu.max pids.max; do [ -r "\$cg/\$f" ] && echo "\$f: \$(cat "\$cg/\$f")"; done
exec $JOB_PY - <<'PY'
import os
for dev in ("/dev/nvidia0", "/dev/nvidiactl"):
    try:
        os.close(os.open(dev, os.O_RDWR))
        print("OPENED", dev)
    except OSError as e:
        print("REFUSED", dev, e.strerror)
PY
EOF
chown "$TUID:$TGID" "$THOME/fence.sh"
echo "\$ mt-job submit --json fence.sh    # as $TNAME"
fsub=$(T=40 as_tenant "$BIN/mt-job" submit --json fence.sh 2>&1); echo "$fsub"
FID=$(echo "$fsub" | json 'print(d["job_id"])' 2>/dev/null)
fstate=""
if [ -n "$FID" ]; then
  for _ in $(seq 1 60); do
    fstate=$(T=20 as_tenant "$BIN/mt-job" show "$FID" --json 2>/dev/null | json 'print(d["state"])' 2>/dev/null)
    case "$fstate" in completed|failed|cancelled|lost) break;; esac
    sleep 1
  done
  T=20 as_tenant "$BIN/mt-job" show "$FID" --json 2>/dev/null | json 'print("state:", d["state"], "| enforced:", d.get("enforced"))'
  flog=$(T=30 as_tenant "$BIN/mt-job" logs "$FID" 2>&1); echo "$flog"
  if [ "$SIM" = 1 ] && [ ! -e /dev/nvidia0 ]; then
    record fence SKIP "no /dev/nvidia0 on this machine (dry run): only the mechanics ran (state ${fstate:-?})"
  elif [ "$fstate" = completed ] && echo "$flog" | grep -q "REFUSED /dev/nvidia0 Operation not permitted" \
       && echo "$flog" | grep -q "^memory.max: 2147483648"; then
    record fence PASS "/dev/nvidia0 refused to a job without GPUs; memory.max 2 GiB in its cgroup"
  else
    record fence FAIL "state ${fstate:-?}; wanted /dev/nvidia0 REFUSED and memory.max 2147483648 in the log"
  fi
else
  record fence FAIL "submit failed"
fi

exit 0   # the EXIT trap cleans up, prints the summary and sets the status
