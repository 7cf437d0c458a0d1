"""Tenants as the API sees them: invitations, first access, keys, clusters, and the
identification of signed requests from off the node."""

from __future__ import annotations

import base64
import json
import pwd
import secrets
import time

from ...client.signing import HEADER_TENANT, BadKey, SignatureVerifier, parse_public_key
from ...model.tenant import validate_share, validate_tenant_name
from ...state import commands as C
from ..dashboard_access import DashboardAccess
from .identity import Caller
from .service import MemberService, ServiceError

INVITE_TTL_S = 7 * 86400.0
INVITATION_PREFIX = "mtgpu-invite-"  # `remotegpu-cli join` takes this (code, node, relays) or the bare code
SEEN_EVERY_S = 3600.0


def code_hash(code: str) -> str:
    from ...directlink.identity import invite_code_hash  # the client derives the invitation's key from it too
    return invite_code_hash(code)


class TenantService:
    def __init__(self, service: MemberService) -> None:
        self.service = service
        self.store = service.store
        self.config = service.config
        self.verifier = SignatureVerifier()
        # the web dashboard's one-time links and sessions (server/dashboard.py), shared by both apps
        self.dashboard = DashboardAccess(time.monotonic, key_of=lambda viewer: viewer.key)

    @property
    def cluster_id(self) -> str:
        """The id tenants are authorized for: CLUSTER_ID, or the node's name when standalone without one."""
        return self.service.cluster_id

    # ------------------------------------------------------------ admin
    def invite(self, caller: Caller, name: str, clusters: list[str], ttl_s: float = INVITE_TTL_S) -> dict:
        self._admin(caller, "inviting a tenant")
        why = validate_tenant_name(name)
        if why:
            raise ServiceError(422, why, refused=True)
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            pw = None
        if pw is not None:
            raise ServiceError(409, f"tenant {name!r}: this machine already has an OS account {name!r} (uid "
                                    f"{pw.pw_uid}); existing accounts are never changed, so choose another name",
                               refused=True)
        code = secrets.token_hex(16)  # 128 bits; never starts with "-" (a CLI would read an option)
        now = self.service.clock()
        clusters = clusters or [self.cluster_id]
        r = self.service.apply(C.TENANT_INVITE, name=name, code_hash=code_hash(code), clusters=clusters,
                               expires_at=now + ttl_s, at=now)
        if not r["ok"]:
            raise ServiceError(409, r["error"], refused=True)
        answer = {"code": code, "name": name, "clusters": clusters, "expires_at": now + ttl_s}
        answer["invitation"] = self._invitation(code, name, now + ttl_s)
        return answer

    def _invitation(self, code: str, name: str, expires_at: float) -> str:
        """The code with what a client needs to join from anywhere: this node's LISTEN and,
        with DirectLink, its relays, its id and a credential for the invitation's own key
        (identity.invite_key), so `remotegpu-cli join INVITATION` works through the relay
        alone from behind NAT (docs/DIRECTLINK.md)."""
        from ...directlink.identity import endpoint_id, invite_key, issue
        link = self.service.directlink
        doc: dict = {"v": 1, "code": code, "cluster_id": self.cluster_id, "node": self.config.NODE_NAME,
                     "server": link.address if link is not None else str(self.config.LISTEN)}
        if link is not None and link.settings.relays:
            ident = endpoint_id(invite_key(code_hash(code)))
            cred = issue(link.cluster_priv, link.cluster_id, ident, "tenant", f"invitee {name}",
                         max(60.0, expires_at - self.service.clock()), now=self.service.clock())
            doc["directlink"] = {"cluster_id": link.cluster_id, "relays": list(link.settings.relays),
                                 "node_id": link.id, "credential": cred.to_dict()}
        raw = json.dumps(doc, separators=(",", ":")).encode()
        return INVITATION_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def tenants(self, caller: Caller) -> list[dict]:
        self._admin(caller, "listing tenants")
        with self.store.lock:
            out = [t.to_dict() for t in self.store.machine.tenants.values()]
        return sorted(out, key=lambda t: t["name"])

    def remove(self, caller: Caller, name: str) -> dict:
        self._admin(caller, "removing a tenant")
        r = self.service.apply(C.TENANT_REMOVE, name=name, at=self.service.clock())
        if not r["ok"]:
            raise ServiceError(409, r["error"])
        self.service.wake()
        return {"removed": name}

    def assign(self, caller: Caller, name: str, clusters: list[str], servers: dict[str, str] | None = None) -> dict:
        """The clusters a tenant may use; with `servers` (where the admin's other clusters
        answer: docs/CLUSTERS.md) as tenant.assign.v2, which a cluster still upgrading does
        not write yet (it says so), else as before."""
        self._admin(caller, "assigning a tenant to clusters")
        if servers:
            r = self.service.apply(C.TENANT_ASSIGN_V2, name=name, clusters=clusters, servers=servers,
                                   at=self.service.clock())
        else:
            r = self.service.apply(C.TENANT_ASSIGN, name=name, clusters=clusters, at=self.service.clock())
        if not r["ok"]:
            raise ServiceError(404, r["error"])
        return {"name": name, "clusters": clusters, "servers": servers or {}}

    def set_share(self, caller: Caller, name: str, share: float) -> dict:
        """The tenant's fair-share weight. A local user (an OS account of this node) that
        has not used the node yet is made a tenant first, with the ids the OS gives it, as
        its first command would; so shares can be set before anyone submits."""
        self._admin(caller, "setting a tenant's share")
        why = validate_share(share)
        if why:
            raise ServiceError(422, f"refused: {why}", refused=True)
        now = self.service.clock()
        if name not in self.store.machine.tenants:
            try:
                pw = pwd.getpwnam(name)
            except KeyError:
                raise ServiceError(404, f"no tenant named {name!r}, and this node has no OS account of that name; "
                                        "`mtgpu-admin tenant list` shows the tenants", refused=True) from None
            r = self.service.apply(C.TENANT_ENSURE, name=name, uid=pw.pw_uid, gid=pw.pw_gid, at=now)
            if not r["ok"]:
                raise ServiceError(409, f"tenant {name!r}: {r['error']}", refused=True)
        r = self.service.apply(C.TENANT_SHARE, name=name, share=float(share), at=now)
        if not r["ok"]:
            raise ServiceError(409, f"refused: {r['error']}", refused=True)
        return {"name": name, "share": r["share"]}

    @staticmethod
    def _admin(caller: Caller, what: str) -> None:
        if not caller.is_admin:
            raise ServiceError(403, f"{what} needs root or the admin group")

    # ------------------------------------------------------------ first access
    def join(self, code: str, key: str) -> dict:
        """Redeem an invite code with a public key: the code is the only credential."""
        try:
            parse_public_key(key)
        except BadKey as e:
            raise ServiceError(422, str(e), refused=True) from None
        lo, hi = self.config.TENANT_UID_RANGE
        r = self.service.apply(C.TENANT_JOIN, code_hash=code_hash(code), key=key.strip(), uid_range=[lo, hi],
                               at=self.service.clock())
        if not r["ok"]:
            raise ServiceError(403, f"join refused: {r['error']}", refused=True)
        self.service.wake()  # the agents create the account
        return {"name": r["name"], "uid": r["uid"], "gid": r["gid"], "clusters": r["clusters"],
                "cluster_id": self.cluster_id, "node": self.config.NODE_NAME, "ssh_listen": self.config.SSH_LISTEN}

    # ------------------------------------------------------------ DirectLink
    def directlink(self, caller: Caller, ident: str) -> dict:
        """What a tenant's client needs to reach the members through a relay: the relays,
        a credential for its key `ident` (one of the keys it joined with), and every
        member's DirectLink id and sshd host key (docs/DIRECTLINK.md)."""
        from ...directlink.identity import TENANT_CREDENTIAL_S, issue
        from ..member.directlink import openssh_key_id
        link = self.service.directlink
        if link is None:
            return {"enabled": False, "cluster_id": self.cluster_id, "relays": [], "nodes": []}
        with self.store.lock:
            keys = list(self.store.machine.tenants[caller.name].keys)
            nodes = [{"name": n.name, "id": n.directlink["id"], "ssh_host_key": n.directlink.get("ssh_host_key", "")}
                     for n in self.store.machine.nodes.values() if n.directlink]
        if ident not in {openssh_key_id(k) for k in keys}:
            raise ServiceError(422, f"refused: {ident[:80]!r} is not the DirectLink id of a key tenant {caller.name!r} "
                                    "joined with (the id is the raw ed25519 public key, 64 hex digits)", refused=True)
        cred = issue(link.cluster_priv, link.cluster_id, ident, "tenant", caller.name, TENANT_CREDENTIAL_S,
                     now=self.service.clock())
        ssh_port = self.config.ssh_listen_host_port()[1]
        return {"enabled": True, "cluster_id": link.cluster_id, "relays": list(link.settings.relays),
                "credential": cred.to_dict(), "nodes": sorted(nodes, key=lambda n: n["name"]), "ssh_port": ssh_port}

    # ------------------------------------------------------------ signed requests
    def identify(self, method: str, path: str, body: bytes, headers) -> Caller:
        """The tenant a signed network request comes from, or ServiceError(401/403)."""
        name = headers.get(HEADER_TENANT)
        tenant = self.store.machine.tenants.get(name) if name else None
        if tenant is None or not tenant.keys:
            raise ServiceError(401, "refused: unknown tenant or no registered key (join with an invite code first)")
        why = self.verifier.verify(method, path, body, headers, tenant.keys)
        if why:
            raise ServiceError(401, f"refused: {why}")
        if self.cluster_id not in tenant.clusters:
            raise ServiceError(403, f"refused: tenant {name!r} is not authorized for cluster {self.cluster_id!r}")
        now = self.service.clock()
        if now - tenant.last_seen_at > SEEN_EVERY_S:
            try:
                self.service.apply(C.TENANT_SEEN, name=name, at=now)
            except ServiceError:
                pass  # activity is best effort
        return Caller(uid=tenant.uid, gid=tenant.gid, pid=0, name=tenant.name, is_admin=False)
