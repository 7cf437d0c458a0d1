"""Bad input against a real node (issue 12): hypothesis-made job files, config files and
requests to every API route, on the local socket (as root and as a tenant) and on the
signed network API. Used by bench/fuzz.py (many cases) and tests/integration/test_fuzz.py
(a small deterministic set).

What counts as a failure:
- `crashes`: the node's process ended, or a config that is not refused with a
  ConfigError (any other exception) when parsed;
- `server_errors`: an answer 500 or above (a refusal must be a 4xx that names the thing);
- `changed_after_refusal`: a refused submission or workspace creation that still took a
  job id (the node's `next_job_id` moved), or a refused tenant change (`/v1/tenants...`,
  `/v1/join`) that changed the tenants' list (names, uids, clusters, shares, keys, as root
  reads it with `GET /v1/tenants`);
- `unchecked`: refusals whose effect could not be compared (the tenants' list or the next
  job id could not be read before or after): said, never counted as clean. A tenant's
  own process cannot read the tenants' list, so its refused tenant changes are compared
  once over its whole run, by root, before and after (`fuzz_node`).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass, field

import httpx
from fastapi.routing import APIRoute

from mtgpu.jobfile import DIRECTIVES

WEIRD = ["", " ", "0", "-1", "1e309", "nan", "inf", "9" * 40, "\x00", "é", "💥", "../../etc/passwd", "a" * 5000,
         "1:2:3", "rtx4090:1|a100:2", "0.5", "1G", "-5G", "99999T", "true", "null", "[]", "{}", "\n", "=", "#MTGPU",
         "${HOME}", "$(reboot)", "; rm -rf /", "exclusive", "shared", "oversubscribe", "0-3%2", "0-99999999"]
FIELDS = ["script", "overrides", "workdir", "template", "image", "name", "resources", "ports", "devcontainer",
          "reason", "clusters", "share", "code", "key", "dry_run", "as_of", "ttl_s", "load", "voter", "voters",
          "term", "node", "listen", "raft", "cluster_id", "gpus", "host"]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 2 else 6)
    if kind == 0:
        return rng.choice(WEIRD)
    if kind == 1:
        return rng.choice([0, -1, 1, 2**63, -2**63, 10**30, 3.5, float("1e300")])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind == 3:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(40)))
    if kind == 4:
        return rng.randrange(1, 70000)
    if kind == 5:
        return rng.choice(list(DIRECTIVES))
    if kind == 6:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        return {rng.choice(FIELDS + list(DIRECTIVES)): _value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return {"path": rng.choice(WEIRD), "image": rng.choice(WEIRD), "mounts": [[rng.choice(WEIRD)] * 3]}


def job_file(rng: random.Random) -> str:
    """Directive lines made of known and unknown keys and odd values; the body is `true`."""
    lines = ["#!/bin/bash"]
    for _ in range(rng.randrange(6)):
        key = rng.choice(list(DIRECTIVES) + ["gpu", "GPUS", "", "mem ", "x" * 50])
        value = str(_value(rng))
        sep = rng.choice(["=", " = ", "==", " ", ""])
        lines.append(f"#MTGPU {key}{sep}{value}".replace("\n", " "))
    lines.append("true")
    return "\n".join(lines) + "\n"


def body(rng: random.Random) -> dict | list | str | int:
    if rng.random() < 0.1:
        return _value(rng)
    return {rng.choice(FIELDS): _value(rng) for _ in range(rng.randrange(6))}


def route_path(rng: random.Random, path: str) -> str:
    params = {"job_id": rng.choice([1, 2, 0, -1, 10**12, "x", "1.5"]), "name": rng.choice(["node-a", "mine", *WEIRD[:8]]),
              "action": rng.choice(["stop", "start", "rm", "save", "x"]), "digest": rng.choice(["sha256:" + "0" * 64, "x"])}
    out = path
    for k, v in params.items():
        out = out.replace("{" + k + "}", httpx.URL("/" + str(v).replace("/", "%2F")).raw_path.decode()[1:] or "x")
    return out


def app_routes(app) -> list[tuple[str, str]]:
    return sorted((m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods)


@dataclass
class Report:
    cases: int = 0
    crashes: int = 0
    server_errors: int = 0
    changed_after_refusal: int = 0
    refused: int = 0
    accepted: int = 0
    unchecked: int = 0
    tenants_unread: int = 0  # refused tenant changes whose caller could not read the list (see fuzz_node)
    examples: list = field(default_factory=list)

    def note(self, what: str, detail) -> None:
        if len(self.examples) < 20:
            self.examples.append({"what": what, **detail})


def config_cases(rng: random.Random, n: int, report: Report) -> None:
    """Configs made of known keys (also in sections) and odd values: ConfigError or a Config, never another error."""
    from mtgpu.config.loader import ConfigError, config_from_dict
    from mtgpu.config.schema import SECTION_MODELS

    keys = {section: list(model.model_fields) for section, model in SECTION_MODELS.items()}
    for _ in range(n):
        doc: dict = {}
        for _ in range(rng.randrange(6)):
            section = rng.choice(list(keys))
            target = doc
            for part in section:
                listed = part in ("SIMULATED_GPUS", "PYTHON_INTERPRETERS")
                if not isinstance(target.get(part), list if listed else dict):
                    target[part] = [{}] if listed else {}
                target = target[part]
                if isinstance(target, list):
                    if not target or not isinstance(target[0], dict):
                        target[:] = [{}]
                    target = target[0]
            target[rng.choice(keys[section] + ["BOGUS"])] = _value(rng)
        report.cases += 1
        try:
            config_from_dict(doc)
        except ConfigError:
            report.refused += 1
        except Exception as e:  # noqa: BLE001 - what fuzzing looks for
            report.crashes += 1
            report.note("config crash", {"config": repr(doc)[:300], "error": f"{type(e).__name__}: {e}"[:300]})
        else:
            report.accepted += 1


QUERIES = ["all=true", "active=1", "offset=-5", "offset=99999999999", "tail=x", "tail=-1", "rank=99", "all=maybe",
           "offset=0&tail=0", "x=%00"]
CREATING = {("POST", "/v1/jobs"), ("POST", "/v1/workspaces")}
COUNTED = ("cases", "crashes", "server_errors", "changed_after_refusal", "refused", "accepted", "unchecked",
           "tenants_unread")


def changes_tenants(method: str, template: str) -> bool:
    return method == "POST" and (template.startswith("/v1/tenants") or template == "/v1/join")


# When a tenant was last active: its own accepted requests move it (a job submitted), as may
# the node's own bookkeeping of anyone's activity. Not what "changed no tenant" is about.
ACTIVITY_STAMPS = ("last_seen_at", "last_login_at")


def tenants_of(client: httpx.Client) -> dict | None:
    """The tenants as the socket's caller reads them (root: all of them), by name, without
    their activity stamps; or None when it cannot."""
    try:
        r = client.get("/v1/tenants")
        if r.status_code != 200:
            return None
        return {t["name"]: {k: v for k, v in t.items() if k not in ACTIVITY_STAMPS} for t in r.json()}
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


def tenant_changes(before: dict, after: dict, caller: str | None = None) -> list[str]:
    """What differs between two tenants_of() readings, tenant by tenant and field by field;
    the caller made a tenant by its own first accepted request (as every local user is, on
    first access) is not a change."""
    out = [f"{name}: {'added' if name in after else 'removed'}" for name in sorted(set(before) ^ set(after))
           if not (name == caller and name in after)]
    for name in sorted(set(before) & set(after)):
        out += [f"{name}.{k}: {before[name].get(k)!r} -> {after[name].get(k)!r}"
                for k in sorted(set(before[name]) | set(after[name])) if before[name].get(k) != after[name].get(k)]
    return out


def api_cases(client: httpx.Client, routes: list[tuple[str, str]], n: int, seed: int, report: Report,
              sign=None, observer: httpx.Client | None = None) -> None:
    """`n` requests to random routes with random paths, queries and bodies. `sign(method,
    path, body)` gives the headers of a signed request (the network API); None: the socket.
    `observer` (the socket as root) reads the tenants' list around a tenant change; None:
    `client` itself, when it is the socket (a tenant's reading is refused: then unchecked)."""
    rng = random.Random(seed)
    if observer is None and sign is None:
        observer = client

    def next_id() -> int | None:
        try:
            return client.get("/v1/health").json().get("next_job_id")
        except (httpx.HTTPError, ValueError):
            return None

    for _ in range(n):
        method, template = rng.choice(routes)
        path = route_path(rng, template)
        if rng.random() < 0.3:
            path += "?" + rng.choice(QUERIES)
        if (method, template) == ("POST", "/v1/jobs") and rng.random() < 0.7:
            overrides = {rng.choice(list(DIRECTIVES)): str(_value(rng)) for _ in range(rng.randrange(3))}
            payload = {"script": job_file(rng), "overrides": overrides}
        else:
            payload = body(rng)
        raw = b"{not json" if rng.random() < 0.05 else json.dumps(payload, allow_nan=True).encode()
        headers = {"content-type": "application/json", **(sign(method, path, raw) if sign else {})}
        creating = (method, template) in CREATING
        before = next_id() if creating else None
        tenant_change = changes_tenants(method, template)
        tenants_before = tenants_of(observer) if tenant_change and observer is not None else None
        report.cases += 1
        try:
            r = client.request(method, path, content=raw if method == "POST" else None, headers=headers)
        except httpx.HTTPError as e:
            report.crashes += 1
            report.note("no answer", {"request": f"{method} {path}", "error": f"{type(e).__name__}: {e}"[:300]})
            return
        if r.status_code >= 500:
            report.server_errors += 1
            report.note("server error", {"request": f"{method} {path}", "body": raw[:300].decode(errors="replace"),
                                         "status": r.status_code, "answer": r.text[:300]})
        elif r.status_code >= 400:
            report.refused += 1
            if creating:
                after = next_id() if before is not None else None
                if before is None or after is None:
                    report.unchecked += 1
                elif after != before:
                    report.changed_after_refusal += 1
                    report.note("changed after refusal", {"request": f"{method} {path}", "answer": r.text[:300]})
            if tenant_change:
                tenants_after = tenants_of(observer) if tenants_before is not None else None
                if tenants_before is None or tenants_after is None:
                    report.tenants_unread += 1
                elif tenants_after != tenants_before:
                    report.changed_after_refusal += 1
                    report.note("tenants changed after refusal", {"request": f"{method} {path}",
                                                                  "answer": r.text[:300]})
        else:
            report.accepted += 1
            if creating:  # keep the node quiet: what was accepted is cancelled at once
                with_ids = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
                for jid in (with_ids.get("job_ids") or [with_ids.get("job_id")] if isinstance(with_ids, dict) else []):
                    if isinstance(jid, int):
                        p = f"/v1/jobs/{jid}/cancel"
                        client.post(p, headers=sign("POST", p, b"") if sign else {})


def stub_apps():
    """The local and the network apps built around a stand-in service, for their route lists."""
    from types import SimpleNamespace

    from mtgpu.server.api.routes import local_app, public_app

    service = SimpleNamespace(config=SimpleNamespace(ADMIN_GROUP="mtgpu-admins"),
                              member=SimpleNamespace(link=SimpleNamespace(is_cluster=False)))
    return local_app(service, SimpleNamespace()), public_app(service, SimpleNamespace())


def socket_client(socket_path: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=socket_path), base_url="http://mtgpu", timeout=30)


def fuzz_node(node, tenant, n: int, seed: int, tmp_dir, python: str, root_dir: str) -> Report:
    """Every kind of case against a running node: configs (in this process), the socket as
    root, the socket as `tenant` (a process of its own), the signed network API as a
    tenant that joined with a key. n cases in all."""
    import subprocess
    from pathlib import Path

    from mtgpu.client.signing import generate_key_pair, load_private_key, sign_headers

    report = Report()
    local, public = stub_apps()
    config_cases(random.Random(seed), n // 5, report)
    with socket_client(str(node.socket_path)) as c:
        api_cases(c, app_routes(local), n // 5, seed + 1, report)
    code = ("import json, sys\nfrom tests.support.fuzzing import Report, api_cases, app_routes, socket_client, stub_apps\n"
            "r = Report()\nwith socket_client(sys.argv[1]) as c:\n"
            "    api_cases(c, app_routes(stub_apps()[0]), int(sys.argv[2]), int(sys.argv[3]), r)\n"
            "print(json.dumps(r.__dict__))\n")
    with socket_client(str(node.socket_path)) as root:
        tenants_before = tenants_of(root)
    w = subprocess.run([python, "-c", code, str(node.socket_path), str(n * 3 // 10), str(seed + 2)],
                       user=tenant.uid, group=tenant.gid, extra_groups=[], capture_output=True, text=True,
                       cwd=tenant.home, timeout=max(600, n), env={"PATH": "/usr/bin:/bin", "HOME": tenant.home,
                                                                  "PYTHONPATH": root_dir})
    if w.returncode != 0:
        raise RuntimeError(f"the tenant's fuzz worker failed: {w.stderr[-2000:]}")
    part = json.loads(w.stdout)
    with socket_client(str(node.socket_path)) as root:
        tenants_after = tenants_of(root)
    # A tenant may change no tenant: its own refused tenant changes (unchecked one by one,
    # it cannot read the list) are checked here, over its whole run.
    if tenants_before is None or tenants_after is None:
        part["unchecked"] += part["tenants_unread"]
    elif tenant_changes(tenants_before, tenants_after, tenant.name):
        report.changed_after_refusal += 1
        report.note("tenants changed by a tenant's requests",
                    {"changes": "; ".join(tenant_changes(tenants_before, tenants_after, tenant.name))[:600]})
    part["tenants_unread"] = 0
    for k in COUNTED:
        setattr(report, k, getattr(report, k) + part[k])
    report.examples += part["examples"][:20 - len(report.examples)]
    name = f"tf{random.Random(seed).randrange(10**6)}"
    invite = node.admin("tenant", "invite", name, "--json")
    if invite.returncode != 0:
        raise RuntimeError(invite.stderr)
    key_path = Path(tmp_dir) / name
    public_key = generate_key_pair(key_path)
    base = f"http://127.0.0.1:{node.port}"
    with httpx.Client(base_url=base, timeout=30) as c, socket_client(str(node.socket_path)) as root:
        j = c.post("/v1/join", json={"code": json.loads(invite.stdout)["code"], "key": public_key})
        if j.status_code != 200:
            raise RuntimeError(f"join failed: {j.text}")
        key = load_private_key(key_path)
        routes = [r for r in app_routes(public) if not r[1].startswith("/cluster/")]
        api_cases(c, routes, n - report.cases, seed + 3, report,
                  sign=lambda m, p, b: sign_headers(key, name, m, p, b), observer=root)
    report.unchecked += report.tenants_unread  # the root and network phases have an observer: none expected
    report.tenants_unread = 0
    report.joined_tenant = name  # type: ignore[attr-defined]
    if node.proc.poll() is not None:
        report.crashes += 1
        report.note("node exited", {"returncode": node.proc.returncode})
    return report
