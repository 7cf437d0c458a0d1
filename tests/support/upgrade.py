"""A rolling upgrade of a real cluster, shared by tests/integration/test_upgrade_cluster.py
and bench/upgrade.py: the previous package (the mtgpu/ of the commit before the newest
one that changed mtgpu/, its tree from git run from a folder of its own), a tenant's stream of submits
beside it, a watch on every member's API, and the upgrade of one member: its server
alone is stopped (SIGTERM; its jobs run on under their shims) and started again from
this checkout with the same config and STATE_DIR."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from mtgpu.client.local import LocalClient

from .cluster import member_name
from .node import PYTHON, REPO_ROOT, Node, wait_for


class NoHistory(Exception):
    """This checkout cannot give the previous package (a shallow clone, or no git)."""


def previous_rev(repo: str = REPO_ROOT) -> str:
    """The commit before the newest one that changed anything under mtgpu/: its mtgpu/ is
    the package this checkout's replaced (HEAD~1's newest change to mtgpu/ is HEAD's own
    package whenever HEAD did not touch mtgpu/, and the upgrade would mix nothing)."""
    git = ["git", "-C", repo]
    shallow = subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True)
    if shallow.returncode != 0:
        raise NoHistory(f"{repo} is not a git checkout ({shallow.stderr.strip()}): the rolling upgrade starts from "
                        "the previous commit's mtgpu; run it in a full clone (git clone without --depth)")
    if shallow.stdout.strip() == "true":
        raise NoHistory(f"{repo} is a shallow clone: the rolling upgrade starts from the previous commit's mtgpu, "
                        "which it does not hold; use a full clone (git fetch --unshallow)")
    newest = subprocess.run([*git, "log", "-n1", "--format=%H", "HEAD", "--", "mtgpu"], capture_output=True, text=True)
    r = subprocess.run([*git, "rev-parse", "--verify", "--quiet", f"{newest.stdout.strip()}~1^{{commit}}"],
                       capture_output=True, text=True) if newest.returncode == 0 and newest.stdout.strip() else newest
    if r.returncode != 0 or not r.stdout.strip():
        raise NoHistory(f"no commit before the last change to mtgpu/ in {repo} ({r.stderr.strip() or 'none found'}): "
                        "the rolling upgrade needs an older mtgpu to start from; use a full clone "
                        "(git fetch --unshallow)")
    return r.stdout.strip()


def files_changed(rev: str, repo: str = REPO_ROOT) -> int:
    """How many files under mtgpu/ differ between `rev` and this checkout (as it is on disk)."""
    r = subprocess.run(["git", "-C", repo, "diff", "--name-only", rev, "--", "mtgpu"], capture_output=True, text=True)
    return len(r.stdout.split())


@contextlib.contextmanager
def previous_package(repo: str = REPO_ROOT, rev: str | None = None) -> Iterator[tuple[str, str, Path]]:
    """(rev, its one-line subject, a folder holding its mtgpu/), removed on exit (after the
    cluster: the old members' shims run from it until their jobs end). `rev`: another
    commit to start from than previous_rev's."""
    rev = rev or previous_rev(repo)
    subject = subprocess.run(["git", "-C", repo, "log", "-n1", "--format=%s", rev], capture_output=True,
                             text=True).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="mtgpu-prev-tree-"))
    try:
        archive = subprocess.run(["git", "-C", repo, "archive", rev, "mtgpu"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        folder.chmod(0o755)
        yield rev, subject, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def tree_prefix(tree: Path | str) -> list[str]:
    """What goes before a member's command line so that it runs the mtgpu of `tree`."""
    return ["env", "-C", str(tree), f"PYTHONPATH={tree}"]


def tree_of(node: Node) -> str:
    """The folder the member's server runs from (its cwd, which tree_prefix set)."""
    return str(Path(f"/proc/{node.proc.pid}/cwd").resolve())


STREAM_JOB = ("#!/bin/bash\necho start $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\nsleep 0.3\n"
              "echo end $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\n")
# runs until the release flag exists (bounded: 20 min), one per member
LONG_JOB = ("#!/bin/bash\n#MTGPU server={member}\necho start $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\n"
            "for i in $(seq 1 6000); do [ -e {marks}/release ] && break; sleep 0.2; done\n"
            "echo end $MTGPU_NODE >> {marks}/$MTGPU_JOB_ID\n")

# The tenant's submitter: one process that submits the job every `every` s to the members
# in turn (the next one when a member does not answer) until the stop flag exists, and
# prints one JSON line per try.
SUBMITTER = """
import json, os, sys, time
from mtgpu.client.local import LocalClient
sockets, script, every, stop = sys.argv[1].split(","), open(sys.argv[2]).read(), float(sys.argv[3]), sys.argv[4]
turn = 0
while not os.path.exists(stop):
    began = time.time()
    for k in range(len(sockets)):
        sock = sockets[(turn + k) % len(sockets)]
        t = time.time()
        try:
            with LocalClient(sock, timeout_s=30) as c:
                ids = c.submit(script)["job_ids"]
            print(json.dumps({"t": t, "first_t": began, "socket": sock, "ids": ids}), flush=True)
            break
        except Exception as e:
            print(json.dumps({"t": t, "socket": sock, "error": f"{type(e).__name__}: {e}"[-300:]}), flush=True)
            time.sleep(0.2)
    turn += 1
    time.sleep(max(0.0, every - (time.time() - began)))
"""


class SubmitStream:
    """The tenant `user` submits STREAM_JOB to the members in turn every `every_s` s."""

    def __init__(self, user, members: list[Node], marks: Path, every_s: float = 0.5) -> None:
        self.marks = marks
        script = marks / "stream-job.sh"
        script.write_text(STREAM_JOB.format(marks=marks))
        self.stop_flag = marks / "stream-stop"
        self.out = marks.parent / f"{marks.name}-submits.jsonl"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [PYTHON, "-c", SUBMITTER, ",".join(str(m.socket_path) for m in members), str(script), str(every_s),
                 str(self.stop_flag)], user=user.uid, group=user.gid, extra_groups=[], cwd=user.home,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={"PATH": "/usr/bin:/bin", "HOME": user.home, "LANG": "C.UTF-8", "PYTHONPATH": REPO_ROOT})

    def tries(self) -> list[dict]:
        lines = self.out.read_text(errors="replace").splitlines() if self.out.exists() else []
        return [json.loads(x) for x in lines if x.startswith("{")]

    def submitted(self) -> list[int]:
        return sorted(i for t in self.tries() if "ids" in t for i in t["ids"])

    def first_tries(self) -> dict[int, float]:
        """Each job's first try (wall clock): a submit another member took after one failed."""
        return {i: t["first_t"] for t in self.tries() if "ids" in t for i in t["ids"]}

    def errors(self) -> list[dict]:
        return [t for t in self.tries() if "error" in t]

    def stop(self) -> None:
        """Stop flag first (it ends after its submit in flight), SIGTERM after 60 s."""
        with contextlib.suppress(OSError):
            self.stop_flag.touch()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=10)
        if self.proc.returncode not in (0, -signal.SIGTERM):
            raise AssertionError(f"the submitter exited with {self.proc.returncode}:\n"
                                 f"{self.out.read_text(errors='replace')[-2000:]}")


@dataclass
class ApiWatch:
    """Asks every member not being upgraded right now for its health and its active jobs,
    every 0.5 s, and keeps what failed: the API answers throughout from the others."""

    members: list[Node]
    out: set[str] = field(default_factory=set)  # members being upgraded now
    failures: list[str] = field(default_factory=list)
    asked: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> "ApiWatch":
        self._thread = threading.Thread(target=self._run, name="api-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for m in self.members:
                name = member_name(m)
                with self.lock:
                    if name in self.out:
                        continue
                try:
                    with LocalClient(str(m.socket_path), timeout_s=15) as c:
                        assert c.health()["ok"]
                        c.jobs(all_tenants=True, active_only=True)
                except Exception as e:  # noqa: BLE001 - kept, then asked again: not an upgraded one
                    with self.lock:
                        if name not in self.out:
                            self.failures.append(f"{time.strftime('%H:%M:%S')} {name}: {type(e).__name__}: {e}")
                self.asked += 1

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def caught_up(member: Node, others: list[Node]) -> bool:
    """The member knows the leader and has applied what the others had when asked."""
    with LocalClient(str(member.socket_path), timeout_s=5) as c:
        info = c.health()
    if not info["raft"] or not info["raft"]["leader"] or not info["scheduler"]:
        return False
    target = 0
    for o in others:
        with contextlib.suppress(Exception), LocalClient(str(o.socket_path), timeout_s=5) as c:
            target = max(target, c.health()["next_job_id"])
    with LocalClient(str(member.socket_path), timeout_s=5) as c:
        return c.health()["next_job_id"] >= target


def upgrade_member(member: Node, others: list[Node], tree: Path | str, watch: ApiWatch | None = None) -> dict:
    """Stop the member's server alone (SIGTERM), start it from `tree` with the same config
    and STATE_DIR, wait until it answers and has caught up with Raft. Seconds from the
    SIGTERM until it exited, answered, and had rejoined."""
    name = member_name(member)
    if watch is not None:
        with watch.lock:
            watch.out.add(name)
    t0 = time.monotonic()
    member.proc.send_signal(signal.SIGTERM)
    try:
        member.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        member.proc.kill()
        member.proc.wait(timeout=10)
        raise AssertionError(f"{name}'s server did not exit within 60 s of SIGTERM (killed):\n"
                             f"{member.server_log()[-3000:]}") from None
    stopped = time.monotonic() - t0
    member.prefix = tree_prefix(tree)
    member.start(wait=False)
    member.wait_up(timeout_s=120)
    answered = time.monotonic() - t0
    wait_for(f"{name} to rejoin Raft (a leader known, caught up with the others)",
             lambda: caught_up(member, others), timeout_s=120, interval_s=0.2)
    rejoined = time.monotonic() - t0
    if watch is not None:
        with watch.lock:
            watch.out.discard(name)
    return {"member": name, "stopped_s": round(stopped, 2), "answered_s": round(answered, 2),
            "rejoined_s": round(rejoined, 2)}


def upgrade_order(cluster) -> Iterator[Node]:
    """The members other than the scheduler (Raft's leader) first, the scheduler last: one
    change of leader (one election, one takeover of the queue) for the whole upgrade, not
    one per member, and the last leader of the old package hands over to members that all
    run the new one."""
    done: set[str] = set()
    while len(done) < len(cluster.members):
        sched = member_name(cluster.scheduler())
        left = [m for m in cluster.members if member_name(m) not in done]
        nxt = next((m for m in left if member_name(m) != sched), left[0])
        done.add(member_name(nxt))
        yield nxt


def runs_of(marks: Path, job_id: int) -> list[str]:
    p = marks / str(job_id)
    return p.read_text().splitlines() if p.exists() else []


def check_runs(records: dict[int, dict], ids: list[int], marks: Path) -> tuple[list[dict], list[dict]]:
    """(lost, run twice): jobs that did not complete or have no end line; jobs that
    started or ended more than once."""
    lost, twice = [], []
    for i in ids:
        lines, rec = runs_of(marks, i), records.get(i) or {}
        ends = sum(1 for x in lines if x.startswith("end"))
        starts = sum(1 for x in lines if x.startswith("start"))
        if rec.get("state") != "completed" or ends == 0:
            lost.append({"id": i, "state": rec.get("state"), "reason": rec.get("reason"), "runs": lines})
        if ends > 1 or starts > 1:
            twice.append({"id": i, "runs": lines, "attempt": rec.get("attempt"), "history": rec.get("history")})
    return lost, twice


def start_delays(records: dict[int, dict], since: float, until: float | None = None) -> list[float]:
    """Seconds from submit to start of the jobs submitted in [since, until)."""
    return [r["started_at"] - r["submitted_at"] for r in records.values()
            if r.get("started_at") and since <= r["submitted_at"] < (until if until is not None else float("inf"))]



def rolling_upgrade(user, old_tree: Path | str, before_s: float = 6.0, every_s: float = 0.5,
                    down_after_s: float = 10.0) -> dict:
    """A 3-member cluster started from `old_tree`, one long job per member and the tenant's
    stream of submits; after `before_s` s the members are upgraded to this checkout one by
    one (upgrade_order), then the long jobs are released and every job must end. What
    happened, for the test's asserts and the bench's figures."""
    from .cluster import running_cluster

    marks = Path(user.home) / f"upgrade-marks-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    marks.mkdir()
    os.chown(marks, user.uid, user.gid)
    old = tree_prefix(old_tree)
    with running_cluster(3, down_after_s=down_after_s, prefixes=[old, old, old]) as cl:
        trees_before = {member_name(m): tree_of(m) for m in cl.members}
        sched = cl.scheduler()
        long_ids = {member_name(m): sched.submit_json(user, script=LONG_JOB.format(member=member_name(m), marks=marks))
                    ["job_id"] for m in cl.members}
        wait_for("a long job running on every member", lambda: all(
            runs_of(marks, j) for j in long_ids.values()), timeout_s=120, interval_s=0.2)
        watch = ApiWatch(cl.members).start()
        stream = SubmitStream(user, cl.members, marks, every_s)
        try:
            began = time.time()
            time.sleep(before_s)  # the stream before the upgrade: the delays to compare with
            upgrade_began = time.time()
            members, long_seen = [], []
            for m in upgrade_order(cl):
                others = [o for o in cl.members if o is not m]
                was_scheduler = member_name(cl.scheduler()) == member_name(m)
                members.append({**upgrade_member(m, others, REPO_ROOT, watch), "was_scheduler": was_scheduler})
                with cl.scheduler().client() as c:
                    long_seen.append({n: (lambda j: (j["state"], j["attempt"]))(c.job(j)) for n, j in long_ids.items()})
            upgrade_ended = time.time()
            time.sleep(before_s / 2)  # and a little after it
        finally:
            stream.stop()
            watch.stop()
            (marks / "release").touch()
        trees_after = {member_name(m): tree_of(m) for m in cl.members}
        sched = cl.scheduler()
        with LocalClient(str(sched.socket_path), timeout_s=30) as c:
            wait_for("every job to end", lambda: not [j for j in c.jobs(all_tenants=True, active_only=True)
                                                        if j.get("tenant") == user.name], timeout_s=300, interval_s=1.0)
            records = {j["id"]: j for j in c.jobs(all_tenants=True) if j.get("tenant") == user.name}
        submitted = stream.submitted()
        stream_ids = sorted((set(submitted) | set(records)) - set(long_ids.values()))
        lost, twice = check_runs(records, stream_ids, marks)
        long_lost, long_twice = check_runs(records, sorted(long_ids.values()), marks)
        before = start_delays({i: records[i] for i in stream_ids if i in records}, began, upgrade_began)
        during = start_delays({i: records[i] for i in stream_ids if i in records}, upgrade_began, upgrade_ended)
        firsts = stream.first_tries()
        seen = [records[i]["started_at"] - firsts[i] for i in firsts if i in records and records[i].get("started_at")
                and upgrade_began <= firsts[i] < upgrade_ended]
        logs = {member_name(m): m.server_log() for m in cl.members}
        return {
            "trees_before": trees_before, "trees_after": trees_after, "members": members,
            "long_jobs": {n: {k: records[j].get(k) for k in ("id", "state", "attempt", "history", "nodes")}
                          | {"runs": runs_of(marks, j)} for n, j in long_ids.items()},
            "long_seen_after_each_member": long_seen, "long_lost": long_lost, "long_twice": long_twice,
            "jobs": len(stream_ids), "submitted_by_stream": len(submitted), "answers_lost": len(set(stream_ids) - set(submitted)),
            "lost": lost, "twice": twice, "submit_errors": stream.errors(),
            "api_asked": watch.asked, "api_failures": watch.failures,
            "delay_before_max_s": round(max(before), 2) if before else None, "jobs_before": len(before),
            "delay_during_max_s": round(max(during), 2) if during else None, "jobs_during": len(during),
            "delay_during_from_first_try_max_s": round(max(seen), 2) if seen else None,
            "upgrade_s": round(upgrade_ended - upgrade_began, 1),
            "tracebacks": {n: text[text.index("Traceback"):][:1500] for n, text in logs.items() if "Traceback" in text},
        }
