"""Time and memory of `mt-job logs` on a large log (issue 9).

Starts a real standalone node (with --relay: three cluster members, the job pinned to
one and the log read through another, so it is relayed member to member), and a
temporary tenant whose job writes about --mb MiB of base64 text
(`head -c ... /dev/urandom | base64`). Then, as the tenant, `mt-job logs ID` prints
it into a pipe this script reads, hashes and counts, and the script prints:
the seconds, MB/s, whether the bytes are identical to the log file, the peak RSS of
the `mt-job` process (from wait4) and of each server involved (VmHWM, reset with
clear_refs just before the read; with its RSS before the read and its CPU seconds
spent meanwhile). Each case runs --runs times.

    python bench/logs.py [--mb 300] [--relay] [--follow] [--runs 1] [--json]      (as root)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def kib(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            h.update(data)
    return h.hexdigest()


def read_log_once(reader, servers: dict[str, int], user, job_id: int, cli_args: list[str]) -> dict:
    """One `mt-job logs` as the tenant, into a pipe; its figures and the servers'."""
    from tests.support.node import PYTHON

    before = {}
    for name, pid in servers.items():
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the RSS now
        before[name] = (kib(Path(f"/proc/{pid}/status"), "VmRSS"), cpu_s(pid))
    h, received = hashlib.sha256(), 0
    t0 = time.perf_counter()
    proc = subprocess.Popen([PYTHON, "-m", "mtgpu.cli.job", "logs", *cli_args, str(job_id)], env=reader.env_for(user.home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, user=user.uid, group=user.gid,
                            extra_groups=[], cwd=user.home)
    while data := proc.stdout.read(1 << 20):
        h.update(data)
        received += len(data)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"mt-job logs exited {proc.returncode}: {stderr.decode(errors='replace')}")
    result = {"seconds": round(seconds, 2), "bytes": received, "mb_per_s": round(received / 2**20 / seconds, 1),
              "sha256": h.hexdigest(), "cli_peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "servers": {}}
    for name, pid in servers.items():
        status_path = Path(f"/proc/{pid}/status")
        result["servers"][name] = {"rss_before_mib": round(before[name][0] / 1024, 1),
                                   "peak_rss_mib": round(kib(status_path, "VmHWM") / 1024, 1),
                                   "cpu_s": round(cpu_s(pid) - before[name][1], 2)}
    return result


def job_script(mb: int, server: str | None) -> str:
    pin = f"#MTGPU server={server}\n" if server else ""
    # base64 writes 4 bytes per 3 (and a newline per 76): about `mb` MiB of text.
    return f"#!/bin/bash\n{pin}head -c {mb * 3 // 4}M /dev/urandom | base64\n"


def run_case(mb: int, relay: bool, runs: int, cli_args: list[str]) -> dict:
    from tests.support.cluster import member_name, running_cluster
    from tests.support.node import running_node
    from tests.support.users import temp_user

    with temp_user("mtbl") as user:
        if relay:
            ctx = running_cluster(3)
        else:
            ctx = running_node([])
        with ctx as cl:
            if relay:
                reader, holder = cl.members[0], cl.members[2]
                servers = {"reader": reader.proc.pid, "holder": holder.proc.pid}
                pin = member_name(holder)
            else:
                reader = holder = cl
                servers = {"node": cl.proc.pid}
                pin = None
            job_id = reader.submit_json(user, script=job_script(mb, pin))["job_id"]
            job = reader.wait_state(job_id, {"completed", "failed"}, timeout_s=600)
            if job["state"] != "completed":
                raise SystemExit(f"the job that writes the log ended {job['state']}: {job['reason']}")
            log = holder.state_dir / Path(job["log_path"]).relative_to(reader.state_dir)
            expected = sha256_file(log)
            size = log.stat().st_size
            results = []
            for _ in range(runs):
                r = read_log_once(reader, servers, user, job_id, cli_args)
                r["identical"] = r.pop("sha256") == expected and r["bytes"] == size
                results.append(r)
            return {"case": "relayed from another member" if relay else "standalone node", "log_bytes": size,
                    "runs": results}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=300, help="the log's size in MiB (about)")
    ap.add_argument("--relay", action="store_true", help="read it through another member of a 3-member cluster")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--follow", action="store_true", help="run `mt-job logs -f` (the job has ended: it reads to the end)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/logs.py runs real nodes and a real tenant: run it as root", file=sys.stderr)
        return 2
    os.chdir(ROOT)
    result = run_case(args.mb, args.relay, args.runs, ["-f"] if args.follow else [])
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['case']}: `mt-job logs{' -f' if args.follow else ''}` of a {result['log_bytes'] / 2**20:.1f} MiB log, as a tenant, into a pipe")
    for r in result["runs"]:
        servers = "; ".join(f"{name}: peak RSS {s['peak_rss_mib']} MiB (before {s['rss_before_mib']} MiB), "
                            f"{s['cpu_s']} CPU s" for name, s in r["servers"].items())
        print(f"  {r['seconds']} s ({r['mb_per_s']} MiB/s), identical: {r['identical']}; "
              f"mt-job peak RSS {r['cli_peak_rss_mib']} MiB; server {servers}")
    return 0 if all(r["identical"] for r in result["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
