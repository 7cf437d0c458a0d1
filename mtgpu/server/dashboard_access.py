"""Who may see the web dashboard: one-time links and the sessions they open (docs/DASHBOARD.md).

A caller the API already knows (a signed tenant request, or a process on the node's
socket) asks for a link: a random token, valid `link_ttl_s`, taken once. Opening the link
exchanges the token for a session: another random value, kept by the browser in an
HttpOnly cookie, valid `session_ttl_s`, bound to the identity the link was made for.
Both live in memory only (a restart of the node ends every session) and are stored by
their SHA-256, so the table holds no usable credential. Pure: time is an argument of
the constructor (a monotonic clock), no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import re
import secrets
import threading
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

LINK_TTL_S = 60.0
SESSION_TTL_S = 12 * 3600.0
# A used or expired link is remembered this long after its expiry, so that opening it
# again says "already used" or "expired" rather than "unknown".
LINK_MEMORY_S = 600.0
MAX_LINKS = 2000
MAX_LINKS_PER_IDENTITY = 20
MAX_SESSIONS = 4000
MAX_SESSIONS_PER_IDENTITY = 16
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{16,128}$")

Identity = TypeVar("Identity")


class Outcome(enum.Enum):
    OPENED = "opened"
    USED = "used"
    EXPIRED = "expired"
    UNKNOWN = "unknown"


class TooManyLinks(Exception):
    """More unopened links than allowed: the message says for whom and when to retry."""


@dataclass(frozen=True)
class Link:
    token: str
    ttl_s: float


@dataclass(frozen=True)
class Redemption(Generic[Identity]):
    """What opening a link gave: a session (its secret and lifetime) or why not."""

    outcome: Outcome
    secret: str | None = None
    identity: Identity | None = None
    ttl_s: float = 0.0


@dataclass
class _LinkRecord(Generic[Identity]):
    identity: Identity
    key: str  # the identity's key, for the per-identity limits
    expires_at: float
    used: bool = False


@dataclass
class _Session(Generic[Identity]):
    identity: Identity
    key: str
    expires_at: float


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class DashboardAccess(Generic[Identity]):
    """The links and sessions of one node. `key_of(identity)` names an identity for the
    per-identity limits (default: its str)."""

    def __init__(self, clock: Callable[[], float], link_ttl_s: float = LINK_TTL_S,
                 session_ttl_s: float = SESSION_TTL_S, key_of: Callable[[Identity], str] = str) -> None:
        self.clock = clock
        self.link_ttl_s = link_ttl_s
        self.session_ttl_s = session_ttl_s
        self.key_of = key_of
        self._links: dict[str, _LinkRecord[Identity]] = {}
        self._sessions: dict[str, _Session[Identity]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------ links
    def issue_link(self, identity: Identity) -> Link:
        """A new one-time link for `identity`; raises TooManyLinks past the limits."""
        now = self.clock()
        key = self.key_of(identity)
        with self._lock:
            self._forget_links(now)
            open_links = sum(1 for r in self._links.values() if r.key == key and not r.used and r.expires_at > now)
            if open_links >= MAX_LINKS_PER_IDENTITY:
                raise TooManyLinks(f"{key} has {open_links} dashboard links not opened yet (at most "
                                   f"{MAX_LINKS_PER_IDENTITY}); open one, or wait {self.link_ttl_s:.0f} s for them "
                                   "to expire")
            if len(self._links) >= MAX_LINKS:
                raise TooManyLinks(f"this node holds {len(self._links)} recent dashboard links (at most {MAX_LINKS}); "
                                   f"try again in {LINK_MEMORY_S / 60:.0f} minutes")
            token = secrets.token_urlsafe(32)
            self._links[_digest(token)] = _LinkRecord(identity, key, now + self.link_ttl_s)
        return Link(token, self.link_ttl_s)

    def redeem(self, token: str) -> Redemption[Identity]:
        """Open a link: the first time within its lifetime gives a session; later, or
        after it expired, it says so."""
        if not isinstance(token, str) or not _TOKEN.match(token):
            return Redemption(Outcome.UNKNOWN)
        now = self.clock()
        with self._lock:
            self._forget_links(now)
            record = self._links.get(_digest(token))
            if record is None:
                return Redemption(Outcome.UNKNOWN)
            if record.used:
                return Redemption(Outcome.USED)
            if record.expires_at <= now:
                return Redemption(Outcome.EXPIRED)
            record.used = True
            secret = secrets.token_urlsafe(32)
            self._add_session(secret, record.identity, record.key, now)
        return Redemption(Outcome.OPENED, secret, record.identity, self.session_ttl_s)

    def _forget_links(self, now: float) -> None:
        stale = [d for d, r in self._links.items() if r.expires_at + LINK_MEMORY_S <= now]
        for d in stale:
            del self._links[d]

    # ------------------------------------------------------------ sessions
    def _add_session(self, secret: str, identity: Identity, key: str, now: float) -> None:
        self._forget_sessions(now)
        mine = sorted((s.expires_at, d) for d, s in self._sessions.items() if s.key == key)
        for _, d in mine[:max(0, len(mine) - MAX_SESSIONS_PER_IDENTITY + 1)]:
            del self._sessions[d]  # the identity's oldest sessions make room
        if len(self._sessions) >= MAX_SESSIONS:
            oldest = min(self._sessions, key=lambda d: self._sessions[d].expires_at)
            del self._sessions[oldest]
        self._sessions[_digest(secret)] = _Session(identity, key, now + self.session_ttl_s)

    def _forget_sessions(self, now: float) -> None:
        stale = [d for d, s in self._sessions.items() if s.expires_at <= now]
        for d in stale:
            del self._sessions[d]

    def session(self, secret: str | None) -> Identity | None:
        """The identity of a live session, or None (unknown, ended or expired)."""
        if not secret or not _TOKEN.match(secret):
            return None
        now = self.clock()
        with self._lock:
            s = self._sessions.get(_digest(secret))
            if s is None:
                return None
            if s.expires_at <= now:
                del self._sessions[_digest(secret)]
                return None
            return s.identity

    def expires_in_s(self, secret: str) -> float:
        """Seconds the session has left (0 when it has none)."""
        with self._lock:
            s = self._sessions.get(_digest(secret)) if secret else None
            return max(0.0, s.expires_at - self.clock()) if s else 0.0

    def end(self, secret: str | None) -> None:
        if secret:
            with self._lock:
                self._sessions.pop(_digest(secret), None)

    def counts(self) -> tuple[int, int]:
        """(links remembered, sessions held), for tests and diagnostics."""
        with self._lock:
            return len(self._links), len(self._sessions)
