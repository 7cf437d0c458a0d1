"""Tenants in the state machine: invitations, first access, ids, keys, clusters.

Two kinds of tenant exist. A *local* tenant is an OS user of a standalone node who
talks to it over the Unix socket (`tenant.ensure.v1`, with the uid the kernel gave).
An *invited* tenant gets a managed account: `tenant.invite.v1` records a one-time
code (only its SHA-256 is kept), `tenant.join.v1` redeems it with the person's
public key and allocates the uid/gid here, in the replicated state, so every node
creates the same numbers. Ids of removed tenants are held back, never reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model.tenant import DEFAULT_SHARE, IdRangeExhausted, allocate_ids, validate_share, validate_tenant_name


class TenantRejected(Exception):
    """Raised by a handler; the machine answers {"ok": False, "error": ...}."""


@dataclass(slots=True)
class TenantRecord:
    name: str
    uid: int
    gid: int
    created_at: float
    last_seen_at: float
    managed: bool = False  # an invited tenant whose account mtgpu creates on every node
    keys: list[str] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)
    last_login_at: float | None = None
    share: float = DEFAULT_SHARE  # fair-share weight (`tenant.share.v1`); docs/SCHEDULING.md
    # where the other clusters of `clusters` answer ({cluster id: HOST:PORT}; format 2): the
    # tenant's client learns them from any of its clusters (docs/CLUSTERS.md)
    servers: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"name": self.name, "uid": self.uid, "gid": self.gid, "created_at": self.created_at,
             "last_seen_at": self.last_seen_at, "managed": self.managed, "keys": list(self.keys),
             "clusters": list(self.clusters), "last_login_at": self.last_login_at, "share": self.share}
        if self.servers:  # only then: a state of format 1 is written as format 1 wrote it
            d["servers"] = dict(self.servers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TenantRecord":
        return cls(**d)


@dataclass(slots=True)
class Invite:
    name: str
    clusters: list[str]
    created_at: float
    expires_at: float
    used_at: float | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "clusters": list(self.clusters), "created_at": self.created_at,
                "expires_at": self.expires_at, "used_at": self.used_at}


class TenantCommands:
    """Handlers for the tenant commands; mixed into state.machine.StateMachine."""

    tenants: dict[str, TenantRecord]
    invites: dict[str, Invite]
    retired_ids: set[int]

    def _tenant_ensure(self, name: str, uid: int, gid: int, at: float) -> dict:
        t = self.tenants.get(name)
        if t is None:
            if any(o.uid == uid for o in self.tenants.values()):
                raise TenantRejected(f"uid {uid} already belongs to another tenant")
            self.tenants[name] = TenantRecord(name, uid, gid, at, at)
            return {"created": True}
        if t.uid != uid:
            raise TenantRejected(f"tenant {name!r} has uid {t.uid}, not {uid}")
        t.last_seen_at = max(t.last_seen_at, at)
        return {"created": False}

    def _tenant_invite(self, name: str, code_hash: str, clusters: list, expires_at: float, at: float) -> dict:
        why = validate_tenant_name(name)
        if why:
            raise TenantRejected(why)
        if name in self.tenants:
            raise TenantRejected(f"tenant {name!r} exists already; `mtgpu-admin tenant assign` changes its clusters")
        if code_hash in self.invites:
            raise TenantRejected("that invite code exists already")
        self.invites[code_hash] = Invite(name, [str(c) for c in clusters], at, expires_at)
        return {}

    def _tenant_join(self, code_hash: str, key: str, uid_range: list, at: float) -> dict:
        invite = self.invites.get(code_hash)
        if invite is None:
            raise TenantRejected("unknown invite code")
        if invite.used_at is not None:
            raise TenantRejected("this invite code was used already; ask an admin for a new one")
        if at > invite.expires_at:
            raise TenantRejected("this invite code has expired; ask an admin for a new one")
        if invite.name in self.tenants:
            raise TenantRejected(f"tenant {invite.name!r} exists already")
        ids = {t.name: (t.uid, t.gid) for t in self.tenants.values()}
        try:
            uid, gid = allocate_ids(ids, (int(uid_range[0]), int(uid_range[1])), frozenset(self.retired_ids))
        except IdRangeExhausted as e:
            raise TenantRejected(str(e)) from None
        self.tenants[invite.name] = TenantRecord(invite.name, uid, gid, at, at, managed=True, keys=[key],
                                                 clusters=list(invite.clusters))
        invite.used_at = at
        return {"name": invite.name, "uid": uid, "gid": gid, "clusters": list(invite.clusters)}

    def _tenant_assign(self, name: str, clusters: list, at: float = 0.0) -> dict:
        self._tenant(name).clusters = [str(c) for c in clusters]
        return {}

    def _tenant_assign_v2(self, name: str, clusters: list, servers: dict, at: float = 0.0) -> dict:
        """The clusters a tenant may use, and where those of other clusters answer."""
        t = self._tenant(name)
        t.clusters = [str(c) for c in clusters]
        t.servers = {str(c): str(a) for c, a in dict(servers).items() if str(c) in t.clusters}
        return {}

    def _tenant_admit(self, name: str, uid: int, gid: int, keys: list, clusters: list, servers: dict,
                      at: float) -> dict:
        """A tenant of another cluster, assigned here by the admin of both (or its clusters
        changed there): the same name, uid, gid and keys on every cluster it may use. Its
        account is made here as for one who joined; `clusters` without this one takes the
        use of it away (the record and ids stay, as after `assign`)."""
        why = validate_tenant_name(name)
        if why:
            raise TenantRejected(why)
        uid, gid = int(uid), int(gid)
        t = self.tenants.get(name)
        created = t is None
        if t is None:
            other = next((o.name for o in self.tenants.values() if uid in (o.uid, o.gid) or gid in (o.uid, o.gid)), None)
            if other is not None:
                raise TenantRejected(f"uid {uid} / gid {gid} of tenant {name!r} belong to tenant {other!r} on this "
                                     "cluster: the same person must have the same ids on every cluster; remove or "
                                     "rename one of them")
            if uid in self.retired_ids or gid in self.retired_ids:
                raise TenantRejected(f"uid {uid} / gid {gid} of tenant {name!r} belonged to a removed tenant of this "
                                     "cluster and are never given again")
            t = self.tenants[name] = TenantRecord(name, uid, gid, at, at, managed=True)
        elif (t.uid, t.gid) != (uid, gid) or not t.managed:
            raise TenantRejected(f"tenant {name!r} is here with uid {t.uid} / gid {t.gid}"
                                 f"{'' if t.managed else ' (a local user of this node)'}, not {uid} / {gid}: a "
                                 "person has one name and the same ids on every cluster")
        t.keys = [str(k) for k in keys]
        t.clusters = [str(c) for c in clusters]
        t.servers = {str(c): str(a) for c, a in dict(servers).items() if str(c) in t.clusters}
        return {"created": created, "uid": uid, "gid": gid}

    def _tenant_share(self, name: str, share: float, at: float = 0.0) -> dict:
        """Set the tenant's fair-share weight: its recent usage counts divided by it."""
        why = validate_share(share)
        if why:
            raise TenantRejected(why)
        t = self._tenant(name)
        t.share = float(share)
        return {"share": t.share}

    def _tenant_remove(self, name: str, at: float = 0.0) -> dict:
        t = self._tenant(name)
        if any(j.uid == t.uid and not j.state.final for j in self.jobs.values()):  # type: ignore[attr-defined]
            raise TenantRejected(f"tenant {name!r} still has queued or running jobs; cancel them first")
        del self.tenants[name]
        if t.managed:
            self.retired_ids.update({t.uid, t.gid})
        return {"uid": t.uid, "managed": t.managed}

    def _tenant_seen(self, name: str, at: float, login: bool = False) -> dict:
        t = self._tenant(name)
        t.last_seen_at = max(t.last_seen_at, at)
        if login:
            t.last_login_at = max(t.last_login_at or 0.0, at)
        return {}

    def _tenant(self, name: str) -> TenantRecord:
        t = self.tenants.get(name)
        if t is None:
            raise TenantRejected(f"no tenant named {name!r}")
        return t
