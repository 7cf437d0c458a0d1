"""DirectLink in the NAT lab (tests/support/natlab.py), one run:

    python bench/directlink.py [--mb 20] [--rounds 300] [--json]

Prints the time from dialling to the first byte through the relay, from dialling to the
direct path (easy NAT), the throughput of one stream direct (easy NAT) and relayed
(--random-fully NAT, where no direct path exists), and plain TCP over the same links as
the floor (host A to the relay's host, through A's router and the wan router, an echo:
each direction carries the rate shown). A stream's throughput is one way: N bytes sent,
the clock stops when the peer's count of them arrives.

The SSH round trip: a real member behind NAT A (tests/support/dlmember.py), a tenant
that joined it, and one `ssh HOST cat` session: a line written, the clock stops when it
comes back (like a keystroke's echo), --rounds times after a warm-up; the median and
p90, through DirectLink from behind NAT B (plain `ssh` with the ProxyCommand block) and
plain `ssh` to the same sshd from inside site A, where it is reachable. Needs root
(network namespaces, a tenant account).

A working day (issue 26, `--only-day` runs it alone): 10 ssh sessions and an scp at once
from one laptop beside an open terminal (aggregate throughput; none ends another), the
relay killed under a direct session (it lives), the laptop's address changed (the
longest a line took to echo: the stall, target under 2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import run_as_root  # noqa: E402
from tests.support.dllab import PY, ROOT, make_keys, run_lab  # noqa: E402
from tests.support.natlab import NatLab, netlab_missing  # noqa: E402

TCP_ECHO = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7555)); s.listen(1); print("listening", flush=True)
c, _ = s.accept()
while data := c.recv(1 << 20):
    c.sendall(data)
"""
TCP_CLIENT = r"""
import socket, sys, time, threading
size = int(sys.argv[2]); c = socket.create_connection((sys.argv[1], 7555))
got = [0]
def rd():
    while got[0] < size:
        d = c.recv(1 << 20)
        if not d: break
        got[0] += len(d)
t0 = time.monotonic(); th = threading.Thread(target=rd); th.start()
block = b"x" * (1 << 16); sent = 0
while sent < size:
    c.sendall(block[: size - sent]); sent += min(len(block), size - sent)
th.join(); print(round(size * 8 / (time.monotonic() - t0) / 1e6, 1))
"""


SSH_ECHO = r"""
import json, statistics, subprocess, sys, time
argv, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
def rtt(i):
    t0 = time.perf_counter(); p.stdin.write(b"ping %d\n" % i); p.stdin.flush()
    line = p.stdout.readline()
    assert line == b"ping %d\n" % i, line
    return (time.perf_counter() - t0) * 1000
rtt(0); end = time.monotonic() + 3
while time.monotonic() < end:  # warm-up: DirectLink moves to the direct path meanwhile
    rtt(1); time.sleep(0.05)
times = sorted(rtt(i) for i in range(rounds))
p.stdin.close(); p.wait(timeout=30)
print(json.dumps({"p50_ms": round(statistics.median(times), 3), "p90_ms": round(times[int(0.9 * len(times))], 3),
                  "stderr": p.stderr.read().decode()[-2000:]}))
"""


def ssh_round_trips(rounds: int, tmp: Path, relayed: bool) -> dict:
    """The median (and p90) echo round trip of one SSH session, through DirectLink from
    behind NAT B (direct on easy NAT; `relayed`: --random-fully NAT, through the relay)
    and plain from inside site A."""
    from tests.support.dlmember import client_env, member_behind_nat

    out: dict = {}
    via = "ssh_relayed_rtt_ms" if relayed else "ssh_rtt_ms"
    with NatLab(random_fully=relayed) as lab, member_behind_nat(lab, tmp / via, (370000, 379999)) as site:
        env = client_env(site.home)
        plain = site.ssh("a", "-o", "ProxyCommand=none", "-o", "HostName=127.0.0.1", "-o", f"Port={site.ssh_port}",
                         "-o", f"HostKeyAlias={site.host}", "-T", "cat")
        for key, argv in ((via, site.ssh("b", "-T", "cat")), ("plain_ssh_rtt_ms", plain)):
            prefix, cmd = argv[:3], argv[3:]  # the namespace, then the ssh command run in it
            r = subprocess.run(prefix + [PY, "-c", SSH_ECHO, json.dumps(cmd), str(rounds)], capture_output=True,
                               text=True, env=env, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"{key}: {r.stderr[-2000:]}")
            got = json.loads(r.stdout)
            out[key], out[key.replace("_ms", "_p90_ms")] = got["p50_ms"], got["p90_ms"]
            if key == via:
                paths = [line.split("path ", 1)[1].split()[0] for line in got["stderr"].splitlines() if "path " in line]
                out[via.replace("_rtt_ms", "_path")] = paths[-1] if paths else "relay"
    out[via.replace("_ms", "_over_plain_ms")] = round(out[via] - out["plain_ssh_rtt_ms"], 3)
    if relayed:  # the plain figure is the first lab's (the same sshd, the same site)
        del out["plain_ssh_rtt_ms"], out["plain_ssh_rtt_p90_ms"]
    return out


def working_day(tmp: Path, mb: int) -> dict:
    """Issue 26: one laptop behind NAT B, one member behind NAT A. An open `ssh -T cat`
    terminal, then 10 ssh sessions each reading MB/4 megabytes and an scp of MB megabytes
    up, all at once (aggregate throughput; the terminal still echoes: none ended another);
    the relay killed under the terminal's direct path (it still echoes; a new ssh started
    meanwhile waits for the relay: the seconds from its restart until that ssh is done);
    the laptop's address changed (lines every
    50 ms; the longest a line took to come back is the stall)."""
    import threading

    from tests.support.dlmember import Terminal, client_env, member_behind_nat

    out: dict = {}
    with NatLab() as lab, member_behind_nat(lab, tmp / "day", (530000, 539999)) as site:
        env = client_env(site.home)
        term = Terminal(site)
        try:
            term.echo("first")
            each = mb * 1_000_000 // 4
            blob = site.home / "blob"
            blob.write_bytes(os.urandom(mb * 1_000_000))
            cfg = ["-F", str(site.ssh_config), "-o", "BatchMode=yes"]
            readers = [subprocess.Popen(site.ssh("b", f"head -c {each} /dev/zero"), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, env=env) for _ in range(10)]
            t0 = time.monotonic()
            scp = subprocess.Popen(lab.prefix("b") + ["scp", "-q", *cfg, str(blob), f"{site.host}:blob"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            got = [0] * 10

            def drain(i: int, p: subprocess.Popen) -> None:
                while data := p.stdout.read(1 << 16):
                    got[i] += len(data)
            threads = [threading.Thread(target=drain, args=(i, p)) for i, p in enumerate(readers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            codes = [p.wait(timeout=60) for p in readers] + [scp.wait(timeout=600)]
            wall = time.monotonic() - t0
            out["ten_ssh_and_scp_ok"] = codes == [0] * 11 and got == [each] * 10
            if not out["ten_ssh_and_scp_ok"]:
                out["ten_ssh_and_scp_errors"] = [p.stderr.read().decode()[-300:] for p in readers + [scp]
                                                 if p.returncode != 0][:3]
            out["ten_ssh_and_scp_mbit_s"] = round((sum(got) + mb * 1_000_000) * 8 / wall / 1e6, 1)
            term.echo("after-eleven")
            out["terminal_lived_beside_them"] = True

            end = time.monotonic() + 30
            while "remotegpu: path direct\n" not in term.err and time.monotonic() < end:
                time.sleep(0.2)
            out["terminal_path_before_relay_kill"] = "direct" if "remotegpu: path direct\n" in term.err else "relay"
            site.stop_relay()
            # a new ssh while the relay is down: it waits for the relay (ConnectTimeout covers the wait)
            waiting = subprocess.Popen(lab.prefix("b") + ["ssh", *cfg, "-o", "ConnectTimeout=150", site.host, "true"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            for i in range(5):
                term.echo(f"relay-gone-{i}")
                time.sleep(1)
            out["relay_kill_survived"] = term.p.poll() is None
            site.start_relay()
            t0 = time.monotonic()
            try:
                _, err = waiting.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                waiting.kill()
                _, err = waiting.communicate(timeout=30)
            said = err.decode(errors="replace")
            out["new_ssh_while_relay_down_ok"] = waiting.returncode == 0 and "not answering; waiting for it" in said
            if not out["new_ssh_while_relay_down_ok"]:
                out["new_ssh_while_relay_down_error"] = said[-300:]
            out["new_ssh_after_relay_back_s"] = round(time.monotonic() - t0, 2)

            end = time.monotonic() + 30  # the new relay connection: the path direct again
            while time.monotonic() < end and not term.err[-1].startswith("remotegpu: path direct"):
                time.sleep(0.2)
            times = []
            moved_at = time.monotonic() + 1.0
            moved = False
            while time.monotonic() < moved_at + 10:
                if not moved and time.monotonic() >= moved_at:
                    lab.move_host("b")
                    moved = True
                times.append(term.echo(f"line-{len(times)}", timeout_s=90))
                time.sleep(0.05)
            out["address_change_survived"] = term.p.poll() is None
            out["address_change_stall_s"] = round(max(times), 2)
            paths = [line.split()[-1] for line in term.err if line.startswith("remotegpu: path ")]
            out["address_change_path_after"] = paths[-1] if paths else "?"
        finally:
            term.close()
    return out


def one_way_mbit(dialer, size: int) -> tuple[float, str]:
    dialer.tell(f"sink {size}")
    e = dialer.event("sunk", timeout_s=180)
    return e["mbit_s"], e["path"]


def run(args) -> dict:
    size = args.mb * 1_000_000
    out: dict = {}
    if args.only_day:
        with tempfile.TemporaryDirectory(prefix="mtgpu-dlbench-") as tmp:
            (Path(tmp) / "day").mkdir()
            return working_day(Path(tmp), args.mb)
    with tempfile.TemporaryDirectory(prefix="mtgpu-dlbench-") as tmp:
        keys = make_keys(Path(tmp))
        with NatLab() as lab:
            procs, dialer = run_lab(lab, keys)
            try:
                first = dialer.event("first_byte")
                out["relay_first_byte_ms"] = first["since_dial_ms"]
                went = first if first["path"] == "direct" else dialer.event("path", timeout_s=20)
                out["direct_after_ms"] = went["since_dial_ms"] if went["path"] == "direct" else None
                out["direct_mbit_s"], path = one_way_mbit(dialer, size)
                out["direct_path_held"] = path == "direct"
            finally:
                for p in procs:
                    p.stop()
            server = subprocess.Popen(lab.prefix("relay") + [PY, "-c", TCP_ECHO, lab.relay_ip],
                                      stdout=subprocess.PIPE, text=True)
            try:
                server.stdout.readline()
                r = subprocess.run(lab.prefix("a") + [PY, "-c", TCP_CLIENT, lab.relay_ip, str(size)],
                                   capture_output=True, text=True, timeout=180)
                out["tcp_mbit_s"] = float(r.stdout.strip())
            finally:
                server.kill()
                server.wait()
        with NatLab(random_fully=True) as lab:
            procs, dialer = run_lab(lab, keys)
            try:
                dialer.event("first_byte")
                time.sleep(6)  # punching gives up: the session stays relayed
                out["relay_mbit_s"], path = one_way_mbit(dialer, size)
                out["relayed_path"] = path
            finally:
                for p in procs:
                    p.stop()
        (Path(tmp) / "ssh_rtt_ms").mkdir()
        (Path(tmp) / "ssh_relayed_rtt_ms").mkdir()
        out.update(ssh_round_trips(args.rounds, Path(tmp), relayed=False))
        out.update(ssh_round_trips(args.rounds, Path(tmp), relayed=True))
        (Path(tmp) / "day").mkdir()
        out.update(working_day(Path(tmp), args.mb))
    out["direct_to_tcp"] = round(out["direct_mbit_s"] / out["tcp_mbit_s"], 3) if out.get("tcp_mbit_s") else None
    out["relay_to_tcp"] = round(out["relay_mbit_s"] / out["tcp_mbit_s"], 3) if out.get("tcp_mbit_s") else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=20, help="megabytes per throughput run (default 20)")
    ap.add_argument("--rounds", type=int, default=300, help="SSH echo round trips measured each way (default 300)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only-day", action="store_true",
                    help="only the working day (issue 26): sessions, relay kill, move")
    args = ap.parse_args()
    os.chdir(ROOT)
    result = run_as_root("directlink", "the DirectLink NAT lab", run, args, why_not=netlab_missing)
    if isinstance(result, int):
        return result
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>30}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
