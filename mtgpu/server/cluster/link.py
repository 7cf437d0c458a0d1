"""Cluster mode: the secret, membership, the Raft store, and the members' traffic
to the scheduler (telemetry reports, joins, pending reasons, logs).

Membership. A member whose own LISTEN is in PEERS (or whose PEERS is empty) is a
founding member: the founding voters are the first 5, 3 or 1 addresses of PEERS
(voter_policy.voter_count of their number), sorted, so every founding member
computes the same set; the other founders start as non-voting members. Any other
member joins through a peer as a non-voting member that still receives every entry.
From then on the scheduler moves the votes to the most capable members
(voter_policy, voter_keeper): it tells a member to reopen its replica as a voter or
as a member (POST /cluster/v1/role). Every report a member sends is answered with
the voters; a member that votes but is not among them steps down by itself (its
replica reopens as a member), and one that knows no leader asks the members it
knows who leads. The role is kept in STATE_DIR/cluster/membership.json for restarts.

Security. The Raft traffic is encrypted and authenticated with a key derived from
the cluster secret (pysyncobj's password); member-to-member HTTP requests are
signed with another key derived from it (HMAC-SHA256 over method, path, time and
body; a request more than 30 s old or wrongly signed is refused).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import httpx

from ...agent.local import LocalAgent
from ...config import Config
from ...model import logstream
from ...model.gpu import GpuInfo, HostInfo
from ...state import commands as C
from ...state.raft import RaftState
from ...state.store import ReplicationError, commit
from ...state.backup import mtgpu_version
from .addresses import advertised, api_address, raft_address
from .formats import StateFormats, stop_on_newer_state
from .seed import ClusterSeed
from .signer import Signer, request_signed
from .standing import Facts, Standing, decide
from .errors import ClusterSetupError, LogUnavailable
from ..member.runtime import Member
from ..member.view import NodeTelemetry
from .voter_keeper import VoterKeeper
from .voter_policy import voter_count

log = logging.getLogger(__name__)
_version_once = functools.lru_cache(maxsize=1)(mtgpu_version)  # said in every report

REPORT_EVERY_S = 1.0
MAJORITY_STALE_S = 1.5  # a scheduler that has not heard a majority for this long takes no report
JOIN_LOG_EVERY_S = 5.0
RETRY_REPORT_S = 0.25
LOG_READ_TIMEOUT_S = 30.0
IMAGE_PATH = "/cluster/v1/images/{digest}"  # an image archive, streamed to another member
IMAGE_READ_TIMEOUT_S = 60.0


class PeerRefused(ClusterSetupError):
    """Another member answered a request with an error status."""

    def __init__(self, address: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{address}{path}: {status} {message}")
        self.status = status
        self.message = message


# ---------------------------------------------------------------- secret and signatures
def load_or_create_secret(config: Config, founding_alone: bool) -> str:
    path = Path(config.secret_file_path)
    if not path.exists():
        if not founding_alone:
            raise ClusterSetupError(
                f"CLUSTER_SECRET_FILE {path} does not exist, and this member joins through PEERS "
                f"{list(config.PEERS)}: copy the file from a member of the cluster (it is that member's "
                "CLUSTER_SECRET_FILE, by default STATE_DIR/cluster.secret), mode 0600, then start again")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(48) + "\n")
        log.info("created a new cluster secret in %s; copy it to every member that joins", path)
    secret = path.read_text().strip()
    if len(secret) < 32:
        raise ClusterSetupError(f"CLUSTER_SECRET_FILE {path} holds {len(secret)} characters; a secret needs at "
                                "least 32 (`mtgpu-setup secret` prints a new one)")
    return secret


# ---------------------------------------------------------------- the link
class ClusterLink:
    """A member's link to the other members of its cluster (see the module's docstring)."""

    is_cluster = True

    def __init__(self, config: Config, secret: str) -> None:
        self.config = config
        self.node_name = config.NODE_NAME
        self.listen = advertised(config.LISTEN)
        self.raft_self = raft_address(config.LISTEN)
        self.signer = Signer(secret)
        self.formats = StateFormats(self.node_name)  # the state formats the members apply (formats.py)
        self.member: Member | None = None
        self.store: RaftState | None = None
        self._http = httpx.Client(timeout=httpx.Timeout(3.0, connect=1.0))
        # where to connect to reach a member's LISTEN address: itself, or a loopback port
        # DirectLink carries to it (server/member/directlink.py)
        self.reach: Callable[[str], str] = lambda address: address
        self._stop = threading.Event()
        self._last_report_ok = 0.0     # monotonic time the last accepted report was sent
        self._leader_commit: int | None = None  # the scheduler's commit index in its last answer
        self._last_leader: str | None = None  # the API address of the scheduler that took the last report
        self._next_refusal_log = 0.0
        self._pending_cache: tuple[float, dict[int, str]] = (0.0, {})
        self._thread: threading.Thread | None = None
        self._keeper_thread: threading.Thread | None = None
        self.keeper = VoterKeeper(self)
        self._role_lock = threading.Lock()
        self._not_counted = 0          # reports in a row whose answer did not count this voter
        self._role_term = 0            # the newest term a role change came from (kept across reopens)
        self._no_leader_since = 0.0
        self._found_leader: tuple[float, str | None] = (0.0, None)
        self._started_at = time.monotonic()
        self._majority_heard_at = 0.0  # monotonic: a majority of the voters last answered this member as leader
        self._said_in_touch: bool | None = None  # the standing the log last told (None: not in touch yet)
        self.seed = ClusterSeed(Path(config.STATE_DIR), config.NODE_NAME)  # a backup to start from (seed.py)

    # ------------------------------------------------------------ requests between members
    def call(self, address: str, method: str, path: str, payload: dict | None = None, timeout_s: float = 3.0):
        body = json.dumps(payload).encode() if payload is not None else b""

        def send(headers):
            return self._http.request(method, f"http://{self.reach(address)}{path}", content=body, headers=headers,
                                      timeout=timeout_s)

        def resigned(before, after):
            log.warning("%s's clock is %+.1fs from this member's (it was %+.1fs): signing in its time from now on",
                        address, after, before)
        r, refused = request_signed(self.signer, send, method, path, body, self.node_name, address, resigned)
        if refused is not None:
            raise PeerRefused(address, path, r.status_code, refused[:500])
        return r.json()

    def leader_api(self) -> str | None:
        leader = self.store.leader_address() if self.store else None
        return api_address(leader) if leader else None

    # ------------------------------------------------------------ membership
    def membership(self, state_dir: Path) -> tuple[bool, list[str], str]:
        """(whether this member votes, the voters it knows, its replica's file name part)."""
        self._membership_path = path = state_dir / "cluster" / "membership.json"
        if path.exists():
            m = json.loads(path.read_text())
            self._role_term = int(m.get("role_term", 0))
            return m["voter"], m["voters"], m.get("replica", "")
        peers = [advertised(p) for p in self.config.PEERS]
        if not peers or self.listen in peers:
            founders = sorted({raft_address(p) for p in peers} | {self.raft_self})
            voters = founders[:voter_count(len(founders))]
            voter = self.raft_self in voters
        else:
            voter, voters = self._join(peers)
        self._save_membership(voter, voters, "")
        return voter, voters, ""

    def _save_membership(self, voter: bool, voters: list[str], replica: str) -> None:
        path = self._membership_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"voter": voter, "voters": voters, "replica": replica,
                                   "role_term": self._role_term}))
        os.replace(tmp, path)

    def _join(self, peers: list[str]) -> tuple[bool, list[str]]:
        """Join through the first peer that answers; log every few seconds what each peer
        answered; give up after JOIN_TIMEOUT_S saying what PEERS must hold."""
        cid, timeout_s = self.config.CLUSTER_ID, self.config.JOIN_TIMEOUT_S
        started = time.monotonic()
        answers: dict[str, str] = {}
        attempt, next_log = 0, started + JOIN_LOG_EVERY_S
        while True:
            attempt += 1
            for peer in peers:
                try:
                    r = self.call(peer, "POST", "/cluster/v1/join", {"name": self.node_name, "listen": self.listen,
                                                                    "raft": self.raft_self, "cluster_id": cid},
                                  timeout_s=15)
                    log.info("%s joined the cluster %s through %s", self.node_name, cid, peer)
                    return r["voter"], r["voters"]
                except PeerRefused as e:
                    if e.status == 401:
                        raise ClusterSetupError(
                            f"the member at {peer} refused this member: {e.message}. Every member needs the same "
                            f"CLUSTER_SECRET_FILE: copy it from a member of the cluster to {self.config.secret_file_path} "
                            "(mode 0600), then start again") from None
                    if e.status == 409 and "CLUSTER_ID" in e.message:
                        raise ClusterSetupError(e.message.removeprefix("refused: ")) from None
                    answers[peer] = f"{e.status}: {e.message}"
                except httpx.ConnectError:
                    answers[peer] = "nothing listens there (connection refused or no route)"
                except httpx.TimeoutException:
                    answers[peer] = "no answer in time"
                except httpx.HTTPError as e:
                    answers[peer] = f"{type(e).__name__}: {e}"
                except (KeyError, TypeError, ValueError):
                    answers[peer] = "an answer that is not mtgpu's (another program on that port?)"
            now = time.monotonic()
            said = "; ".join(f"{p}: {answers[p]}" for p in peers if p in answers)
            if now - started >= timeout_s:
                raise ClusterSetupError(
                    f"could not join the cluster {cid!r} through PEERS in {timeout_s:g} s (JOIN_TIMEOUT_S): {said}. "
                    f"PEERS must list the founding members' LISTEN addresses, the same list in every member's "
                    f"config; this member's LISTEN {self.listen} is not in it, so it joins through them. Check that "
                    "the founding members run (a majority of them, so that one schedules) and that this machine "
                    "reaches their LISTEN port, fix PEERS if an address is wrong, then start this member again")
            if now >= next_log:
                log.warning("%s is not in the cluster %s yet (attempt %d, %.0f of %g s): %s", self.node_name, cid,
                            attempt, now - started, timeout_s, said)
                next_log = now + JOIN_LOG_EVERY_S
            time.sleep(min(1.0, max(0.0, started + timeout_s - now)))

    def check_cluster_id(self, name: str, cluster_id: str | None) -> None:
        """Refuse a member of another cluster (or one that says none), naming both ids."""
        own = self.config.CLUSTER_ID
        if cluster_id == own:
            return
        if cluster_id is None:
            raise ClusterSetupError(f"refused: member {name} did not say its CLUSTER_ID (an older mtgpu?); this "
                                    f"cluster is {own!r}: upgrade it and set CLUSTER_ID = \"{own}\"")
        raise ClusterSetupError(
            f"refused: member {name} has CLUSTER_ID {cluster_id!r}, but this cluster is {own!r}: to join it, set "
            f"CLUSTER_ID = \"{own}\" in that member's config; to form the cluster {cluster_id!r}, point its PEERS "
            f"at that cluster's founding members")

    def handle_join(self, name: str, listen: str, raft: str, cluster_id: str | None = None) -> dict:
        """On the scheduler: admit a new member, as a non-voting one (the keeper
        promotes it if it is among the most capable)."""
        self.check_cluster_id(name, cluster_id)
        if not self.store.is_leader():
            leader = self.leader_api()
            if leader is None:
                raise ReplicationError("no scheduler right now; try again in a moment")
            return self.call(leader, "POST", "/cluster/v1/join",
                             {"name": name, "listen": listen, "raft": raft, "cluster_id": cluster_id}, 15)
        voters = self.store.voters()
        return {"voter": raft in voters, "voters": voters}

    def handle_role(self, voter: bool, voters: list[str], term: int) -> dict:
        """On a member, told by the scheduler: reopen the replica as a voter or a member."""
        floor = max(self.store.term(), self._role_term)
        if term < floor:
            raise ClusterSetupError(f"a role change from term {term}, older than this member's {floor}")
        self._role_term = term
        self._take_role(voter, voters)
        return {"generation": self.store.generation, "boot": self.store.boot, "voter": self.store.is_voter()}

    def _take_role(self, voter: bool, voters: list[str]) -> None:
        with self._role_lock:
            if voter == self.store.is_voter():
                return
            log.info("%s reopens its replica as a %s (voters: %s)", self.node_name,
                     "voter" if voter else "non-voting member", ", ".join(voters))
            # Recorded first: a crash in between restarts in the new role with a fresh
            # replica, never in the old role with an emptied one.
            self._save_membership(voter, voters, self.store.next_replica())
            self.store.reopen(self.raft_self if voter else None, voters)

    def handle_remove(self, name: str) -> dict:
        """On the scheduler: take a member out of the cluster (out of the voters too).
        It must run no job: drain it and let its jobs finish, or let it be marked down."""
        if not self.store.is_leader():
            leader = self.leader_api()
            if leader is None:
                raise ReplicationError("no scheduler right now; try again in a moment")
            try:
                return self.call(leader, "POST", "/cluster/v1/remove", {"name": name}, 15)
            except PeerRefused as e:
                raise ClusterSetupError(e.message) from None
            except httpx.HTTPError as e:
                raise ReplicationError(f"the scheduler at {leader} did not answer ({e}); try again") from None
        rec = self.store.machine.nodes.get(name)
        if rec is None:
            raise ClusterSetupError(f"no member named {name!r}")
        if name == self.node_name:
            raise ClusterSetupError(f"{name} schedules now; remove it from another member after it stopped")
        busy = [j.id for j in self.store.machine.running_jobs() if any(a.node == name for a in j.allocations)]
        if busy:
            raise ClusterSetupError(f"{name} still runs jobs {busy}: `mtgpu-admin nodes drain {name}` and let them "
                                    "finish (or stop the member so it is marked down) first")
        raft = raft_address(rec.address)
        if raft in self.store.voters():
            self.keeper.remove_now(raft)
        r = commit(self.store, C.NODE_REMOVE_V2, name=name, at=self.member.clock())
        if not r["ok"]:
            raise ClusterSetupError(r["error"])
        self.member.scheduler.telemetry.pop(name, None)
        return {"removed": name}

    def raft_info(self) -> dict:
        return {"cluster_id": self.config.CLUSTER_ID, "leader": self.store.leader_address(), "term": self.store.term(),
                "voter": self.store.is_voter(),
                "voters": self.store.voters(), "is_leader": self.store.is_leader(),
                "bind_problem": self.store.bind_problem()}

    def voter_names(self) -> list[str]:
        by_addr = {advertised(n.address): n.name for n in self.store.machine.nodes.values() if n.address}
        return [by_addr.get(api_address(v), v) for v in self.store.voters()]

    # ------------------------------------------------------------ reports
    def start(self, member: Member) -> None:
        self.member = member
        self._thread = threading.Thread(target=self._report_loop, name="mtgpu-reports", daemon=True)
        self._thread.start()
        # Its own thread: a step may wait seconds for a commit or a member, and reports
        # (which keep this member's jobs' lease fresh) must not wait for it.
        self._keeper_thread = threading.Thread(target=self._keeper_loop, name="mtgpu-voters", daemon=True)
        self._keeper_thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in (self._thread, self._keeper_thread):
            if thread:
                thread.join(timeout=5)
        self._http.close()

    def _keeper_loop(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            try:
                self._say_standing()
                if self.store.is_leader():
                    self.seed.step(self.store)
                    self.keeper.step()
            except Exception:  # never let one bad step end the thread
                log.exception("voters: the step failed")

    def _report_loop(self) -> None:
        """Report at once, then every REPORT_EVERY_S; after a report that was not taken,
        again soon: the jobs' lease is only as fresh as the last report taken."""
        wait = 0.0
        while not self._stop.wait(wait):
            try:
                wait = REPORT_EVERY_S if self.report_once() else RETRY_REPORT_S
            except PeerRefused as e:
                if e.status == 409 and "CLUSTER_ID" in e.message and time.monotonic() >= self._next_refusal_log:
                    log.error("%s: the scheduler refuses this member's reports: %s", self.node_name, e.message)
                    self._next_refusal_log = time.monotonic() + 10.0
                self._last_leader = None
                wait = RETRY_REPORT_S
            except Exception as e:  # the scheduler may be changing; try again soon
                log.debug("report failed: %s", e)
                self._last_leader = None
                wait = RETRY_REPORT_S

    def report_once(self) -> bool:
        """Send this member's report to the scheduler; True when it was taken (or this
        member schedules itself)."""
        tel = self.member.local_telemetry
        if tel is None:
            return False
        if self.store.is_leader():
            self._no_leader_since = 0.0
            self.renew_lease()
            return True
        leader = self.leader_api()
        if leader is None and self._last_leader is not None:
            # The replica knows no leader for a moment (it is reopening in a new role, or
            # just started): keep reporting to the scheduler that took the last report.
            leader = self._last_leader
        if leader is None:
            leader = self._find_leader()
            if leader is None:
                return False
        else:
            self._no_leader_since = 0.0
        store = self.store
        sent = time.monotonic()
        answer = self.call(leader, "POST", "/cluster/v1/report", {
            "node": self.node_name,
            "cluster_id": self.config.CLUSTER_ID,
            "gpus": [g.to_dict() for g in tel.gpus],
            "host": tel.host.to_dict() if tel.host else None,
            "raft": {"voter": store.is_voter(), "applied": store.applied_index(), "caught_up": store.caught_up(),
                     "generation": store.generation, "boot": store.boot},
            "state_format": C.STATE_FORMAT, "mtgpu_version": _version_once(),
        }, timeout_s=2.0)
        self.formats.told(answer.get("state_format_floor"))
        # The lease and the commit index before the moment that makes this member in
        # touch: a reader that sees it in touch sees them too (lease.py says why sent - age).
        age = answer.get("majority_age_s")
        if self.member.lease is not None and isinstance(age, (int, float)) and age >= 0:
            self.member.lease.renew(sent - age)
        self._last_leader = leader
        if isinstance(answer.get("commit"), int):
            self._leader_commit = answer["commit"]
        if isinstance(age, (int, float)) and age >= 0:
            self._last_report_ok = sent
        self._check_counted(answer.get("voters"))
        return True

    def _check_counted(self, voters: list[str] | None) -> None:
        """A voter that the scheduler twice in a row does not count (it was taken out
        while it was away, or a promotion was undone) reopens as a member. Voting
        less is always safe; only the scheduler promotes."""
        if voters is None or not self.store.is_voter() or self.raft_self in voters:
            self._not_counted = 0
            return
        self._not_counted += 1
        if self._not_counted >= 2:
            log.info("%s votes but the scheduler does not count it: it steps down to a member", self.node_name)
            self._not_counted = 0
            self._take_role(False, voters)

    def _find_leader(self) -> str | None:
        """When this member's replica knows no leader for a while (e.g. it votes but
        was taken out of the voters while it was stopped), ask the members it knows."""
        now = time.monotonic()
        if not self._no_leader_since:
            self._no_leader_since = now
        at, found = self._found_leader
        if now - self._no_leader_since < 1.0 or now - at < 1.0:
            return found if now - at < 1.0 else None
        known = {advertised(n.address) for n in self.store.machine.nodes.values() if n.address}
        known |= {advertised(p) for p in self.config.PEERS}
        known.discard(self.listen)
        found = None
        for address in sorted(known):
            try:
                info = self.call(address, "GET", "/cluster/v1/raft", timeout_s=1.0)
            except (httpx.HTTPError, ClusterSetupError, ValueError):
                continue
            if info.get("cluster_id") != self.config.CLUSTER_ID:
                log.error("%s: the member at %s belongs to the cluster %r, this member's CLUSTER_ID is %r: the "
                          "members of one cluster need one CLUSTER_ID (and PEERS listing only its founding members)",
                          self.node_name, address, info.get("cluster_id"), self.config.CLUSTER_ID)
                continue
            if info.get("is_leader"):
                found = address
                break
            if info.get("leader"):
                found = api_address(info["leader"])
        self._found_leader = (now, found)
        return found

    def handle_report(self, payload: dict) -> dict:
        """On the scheduler: keep a member's telemetry report; the answer tells the member
        whether it is in touch (see report_once). Every member calls it each second."""
        name = payload["node"]
        self.check_cluster_id(name, payload.get("cluster_id"))
        self.formats.heard(name, payload)
        host = payload.get("host")
        mono = time.monotonic()
        tel = NodeTelemetry([GpuInfo.from_dict(g) for g in payload.get("gpus", ())],
                            HostInfo.from_dict(host) if host else None, self.member.clock(), mono)
        news = self.member.scheduler.report(name, tel)
        store = self.store
        leading, heard_at, voters, term = store.leader_facts()
        if not leading:
            # A member that still takes us for the scheduler must not count itself in touch.
            raise ReplicationError("this member does not schedule (any more); ask the cluster who does")
        age = max(0.0, mono - heard_at)
        if age > MAJORITY_STALE_S:
            raise ReplicationError(f"this scheduler has not heard a majority of the voters for {age:.1f}s")
        commit = store.commit_index()
        self.keeper.on_report(name, payload.get("raft"), commit)
        if news:
            self.member.wake()
        floor = self.formats.floor_of(list(store.machine.nodes))
        return {"ok": True, "voters": voters, "term": term, "commit": commit, "majority_age_s": age,
                "state_format_floor": floor}

    def in_touch(self) -> bool:
        """Whether this member hears the cluster: it leads with a quorum, or the
        scheduler took one of its reports recently. (The jobs' lease is what keeps them
        running: see lease.py.)"""
        if self.store.is_leader():
            return True
        return time.monotonic() - self._last_report_ok < 3 * REPORT_EVERY_S

    def standing(self) -> Standing:
        """In touch, or cut off since when and what still works here (standing.py)."""
        now = time.monotonic()
        leads = self.store.is_leader()
        if leads:
            self._heard_majority(now - self.store.majority_heard_age_s())
        lease = self.member.lease if self.member is not None else None
        facts = Facts(self.node_name, now, time.time(), leads, self._majority_heard_at, self._last_report_ok,
                      self._started_at, MAJORITY_STALE_S, 3 * REPORT_EVERY_S,
                      lease.at + lease.timeout_s if lease is not None and lease.at else None,
                      other_leader=not leads and self.store.leader_address() not in (None, self.raft_self))
        standing = decide(facts)
        if standing.in_touch:
            return standing
        with self.store.lock:
            here = sum(1 for j in self.store.machine.running_jobs()
                       if any(a.node == self.node_name for a in j.allocations))
        standing = decide(replace(facts, jobs_here=here))
        bind = self.store.bind_problem()
        if bind:  # the cause, when it is this member's own Raft port (raft_route.py)
            standing = replace(standing, problem=f"{standing.problem}; {bind}")
        return standing

    def _say_standing(self) -> None:
        """One line in the log when this member, once in touch, is cut off from its cluster
        (since when, what still works here and what does not), one when it hears it again."""
        standing = self.standing()
        said = self._said_in_touch
        self._said_in_touch = standing.in_touch if said is not None or standing.in_touch else None
        if said is True and not standing.in_touch:
            log.warning("%s. Still works here: %s. Not now: %s", standing.problem, "; ".join(standing.works),
                        "; ".join(standing.fails))
        elif said is False and standing.in_touch:
            log.info("%s hears its cluster again", self.node_name)

    def _heard_majority(self, at: float) -> None:
        if at > self._majority_heard_at:
            self._majority_heard_at = at

    def quorum_problem(self) -> str | None:
        """None while this member hears the cluster (it schedules with a majority, or the
        scheduler took one of its reports lately); else what it cannot reach and since
        when, so that a view of its replica is not taken for the cluster's current state."""
        return self.standing().problem

    def renew_lease(self) -> None:
        """The scheduler's member renews its jobs' lease from its last word with a
        majority; the others renew it when a report is taken (report_once)."""
        if self.store.is_leader():
            at = time.monotonic() - self.store.majority_heard_age_s()
            self._heard_majority(at)
            if self.member.lease is not None:
                self.member.lease.renew(at)

    def in_sync(self) -> bool:
        """Whether this member reads the cluster's current state, so that its agent may
        start and stop jobs. The scheduler: once its epoch is committed (everything before
        it is then applied). Another member: the scheduler took a report of it recently,
        and its replica has applied everything the scheduler had committed when it
        answered. (A member back from a crash or a role change reads a stale replica
        until then.)"""
        if self.store.is_leader():
            return self.member.scheduler.epoch == self.store.term()
        if not self.in_touch() or self._leader_commit is None or not self.store.caught_up():
            return False
        return self.store.applied_index() >= self._leader_commit

    # ------------------------------------------------------------ reads from other members
    def pending_reasons(self) -> dict[int, str]:
        at, cached = self._pending_cache
        if time.monotonic() - at < 1.0:
            return cached
        leader = self.leader_api()
        reasons: dict[int, str] = {}
        if leader:
            try:
                reasons = {int(k): v for k, v in self.call(leader, "GET", "/cluster/v1/pending", timeout_s=2.0).items()}
            except (httpx.HTTPError, ClusterSetupError, ValueError):
                reasons = {}
        self._pending_cache = (time.monotonic(), reasons)
        return reasons

    def leader_nodes(self) -> list[dict] | None:
        leader = self.leader_api()
        if leader is None:
            return None
        try:
            return self.call(leader, "GET", "/cluster/v1/nodes", timeout_s=3.0)
        except (httpx.HTTPError, ClusterSetupError):
            return None

    def fetch_image(self, node_name: str, digest: str, dest: Path) -> None:
        """Stream an image archive from the member `node_name` into `dest` (the caller
        verifies its digest before keeping it). Raises OSError saying what failed."""
        rec = self.store.machine.nodes.get(node_name)
        if rec is None or not rec.address:
            raise OSError(f"{node_name} is not a member with a known address")
        path = IMAGE_PATH.format(digest=digest)
        address = advertised(rec.address)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                for again in (False, True):
                    sent_at = self.signer.clock()
                    headers = self.signer.headers("GET", path, b"", self.node_name, peer=address)
                    with httpx.stream("GET", f"http://{self.reach(address)}{path}", headers=headers,
                                      timeout=httpx.Timeout(IMAGE_READ_TIMEOUT_S, connect=3.0)) as r:
                        learned = self.signer.learn(address, headers, r.headers, sent_at, self.signer.clock())
                        if r.status_code >= 400:
                            message = r.read()[:300].decode("utf-8", "replace")
                            if not again and learned is not None and self.signer.refused_as_stale(r.status_code,
                                                                                                  message):
                                continue  # its clock is elsewhere: signed again in its time
                            raise OSError(f"{address} answered {r.status_code} {message}")
                        for chunk in r.iter_raw(1 << 20):
                            f.write(chunk)
                        return
        except httpx.HTTPError as e:
            raise OSError(f"{address}: {type(e).__name__}: {e}") from None

    async def open_log(self, node_name: str, job_id: int, offset: int, tail_lines: int | None,
                       rank: int) -> "RemoteLog":
        """Start streaming a job's log from the member that holds it (bounded chunks, its
        exact length announced). Raises LogUnavailable when that member cannot be asked."""
        rec = self.store.machine.nodes.get(node_name)
        if rec is None or not rec.address:
            raise LogUnavailable(f"{node_name} is not a member with a known address")
        query = f"offset={offset}&rank={rank}" + (f"&tail={tail_lines}" if tail_lines is not None else "")
        path = logstream.MEMBER_LOG_STREAM_PATH.format(job_id=job_id) + "?" + query
        address = advertised(rec.address)
        client = httpx.AsyncClient(timeout=httpx.Timeout(LOG_READ_TIMEOUT_S, connect=2.0))
        try:
            for again in (False, True):
                sent_at = self.signer.clock()
                headers = self.signer.headers("GET", path, b"", self.node_name, peer=address)
                target = await asyncio.to_thread(self.reach, address)  # it may try the member first
                response = await client.send(client.build_request("GET", f"http://{target}{path}", headers=headers),
                                             stream=True)
                learned = self.signer.learn(address, headers, response.headers, sent_at, self.signer.clock())
                if response.status_code < 400:
                    break
                body = (await response.aread())[:300].decode("utf-8", "replace")
                await response.aclose()
                if again or learned is None or not self.signer.refused_as_stale(response.status_code, body):
                    raise LogUnavailable(f"{address} answered {response.status_code} {body}")
            start, end = int(response.headers[logstream.START]), int(response.headers[logstream.END])
        except (httpx.HTTPError, KeyError, ValueError) as e:
            await client.aclose()
            raise LogUnavailable(f"{address}: {type(e).__name__}: {e}") from None
        except BaseException:
            await client.aclose()
            raise

        async def chunks():
            try:
                async for data in response.aiter_raw():
                    yield data
            except httpx.HTTPError as e:
                log.warning("log of job %d from %s broke off: %s", job_id, node_name, e)
                raise

        async def close() -> None:
            await response.aclose()
            await client.aclose()

        return RemoteLog(start, end, chunks(), close)


@dataclass
class RemoteLog:
    """A log being streamed from another member: bytes [start, end) as `chunks`."""

    start: int
    end: int
    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


def open_cluster_member(config: Config, agent: LocalAgent, directlink=None) -> Member:
    """`directlink(secret)`: starts this member's DirectLink side (or None) before it joins, so
    members behind NAT are reached through the relay from the first request on."""
    peers = [advertised(p) for p in config.PEERS]
    founding_alone = not peers or peers == [advertised(config.LISTEN)]
    secret = load_or_create_secret(config, founding_alone)
    link = ClusterLink(config, secret)
    dl = directlink(secret) if directlink is not None else None
    if dl is not None:
        link.reach = dl.reach_api
    state_dir = Path(config.STATE_DIR)
    voter, voters, replica = link.membership(state_dir)
    member_holder: list[Member] = []
    store = RaftState(state_dir / "cluster", link.raft_self if voter else None, voters, secret,
                      on_applied=lambda cmd, res: member_holder and member_holder[0].wake(), replica=replica,
                      cluster_id=config.CLUSTER_ID, route=dl.reach_raft if dl is not None else None,
                      on_newer=stop_on_newer_state,
                      format_floor=lambda: link.formats.floor(link.store.is_leader(), list(link.store.machine.nodes)))
    link.store = store
    member = Member(config, agent, store, link=link, down_after_s=config.MEMBER_DOWN_AFTER_S)
    member_holder.append(member)
    link.start(member)
    log.info("%s is a %s of the cluster %s (voters: %s)", config.NODE_NAME, "voter" if voter else "non-voting member",
             config.CLUSTER_ID, ", ".join(voters))
    return member
