"""Images from a private registry (issue 10): a real registry (Debian's docker-registry,
TLS with its own CA, htpasswd), real Podman, real tenants. The node pulls `[CONTAINERS]
images` as root with `registry_auth_file`; a tenant's container job runs in the image and
the tenant never sees the credentials (not the file, not in its job, not in its podman).
An auth file others can read stops the server at start; a wrong password fails the image
(named, with podman's message) while the node keeps running; one tenant's registry image
and containers are invisible to another."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.support.images import busybox_image, podman_missing
from tests.support.node import running_node, wait_for
from tests.support.registry import private_registry, registry_missing
from tests.support.users import can_create_users

if can_create_users() or podman_missing() or registry_missing():
    pytest.skip(can_create_users() or podman_missing() or registry_missing(), allow_module_level=True)

GPUS = [{"model": "NVIDIA GeForce RTX 4090", "vendor": "nvidia", "vram": "24G", "count": 1}]
REPO = "team/bb:1"  # pulled with the good credentials
DENIED = "team/denied:1"  # only ever asked for with a wrong password: never in root's store


@pytest.fixture(scope="module")
def registry():
    with busybox_image() as local, private_registry() as reg:
        reg.push(local, REPO)
        reg.push(local, DENIED)
        yield reg


def _containers(node, member: str = "node-a") -> dict:
    with node.client() as c:
        for n in c.nodes():
            if n["name"] == member:
                return n.get("containers") or {}
    return {}


def _staged_or_fail(node, ref: str) -> str | None:
    c = _containers(node)
    if ref in (c.get("failed") or {}):
        raise AssertionError(f"staging {ref} failed: {c['failed'][ref]}")
    return (c.get("staged") or {}).get(ref)


@pytest.fixture(scope="module")
def rnode(registry):
    ref = registry.ref(REPO)
    with running_node(GPUS, CONTAINERS={"enabled": True, "images": [ref],
                                        "registry_auth_file": str(registry.auth_file)}) as node:
        try:
            wait_for(f"{ref} to be staged", lambda: _staged_or_fail(node, ref), timeout_s=180, interval_s=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- server log:\n{node.server_log()[-3000:]}\n--- registry log:\n"
                                 f"{registry.log()[-2000:]}") from None
        yield node


def mt_podman(node, user, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return node.run_cli("mtgpu.cli.podman", user, *args, timeout_s=timeout_s)


def as_user(user, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), user=user.uid, group=user.gid, extra_groups=[], cwd=user.home,
                          env={"PATH": "/usr/bin:/bin", "HOME": user.home, "LANG": "C.UTF-8"},
                          capture_output=True, text=True, timeout=60)


def log_of(node, user, job_id: int) -> str:
    r = node.mt_job(user, "logs", str(job_id))
    assert r.returncode == 0, r.stderr
    return r.stdout


def finished(node, job_id: int, timeout_s: float = 180) -> dict:
    return node.wait_state(job_id, {"completed", "failed", "cancelled", "lost"}, timeout_s=timeout_s)


def test_the_node_pulls_the_image_from_the_private_registry_and_a_tenant_job_runs_in_it(rnode, registry, alice):
    ref = registry.ref(REPO)
    c = _containers(rnode)
    digest = c["staged"][ref]
    assert digest.startswith("sha256:") and ref not in (c.get("failed") or {}), c
    assert ref in c["images"], c
    # It came from the registry (root's store did not have it): the registry served its manifest.
    assert registry.manifest_gets(REPO) >= 1, registry.log()[-2000:]
    assert (rnode.state_dir / "images" / f"sha256-{digest.split(':', 1)[1]}.tar").is_file()

    script = (f"#MTGPU container={ref}\n"
              "echo registry-job uid=$(id -u) node=$MTGPU_NODE job=$MTGPU_JOB_ID\n"
              "if [ -e /usr/bin/python3 ]; then echo host-filesystem; else echo busybox-image; fi\n")
    jid = rnode.submit_json(alice, script=script)["job_id"]
    job = finished(rnode, jid)
    out = log_of(rnode, alice, jid)
    assert job["state"] == "completed" and job["exit_code"] == 0, (job["reason"][:800], out)
    assert f"registry-job uid={alice.uid} node=node-a job={jid}" in out and "busybox-image" in out, out
    # The tenant's store got it from the node's archive, under the registry's name.
    assert mt_podman(rnode, alice, "image", "exists", ref).returncode == 0


def test_the_tenant_never_sees_the_registry_credentials(rnode, registry, alice):
    ref = registry.ref(REPO)
    secrets = (registry.password, registry.auth)
    auth_file = registry.auth_file
    # The file: its folder lets the tenant through (0755), its own mode (root, 0600) stops it.
    assert auth_file.stat().st_uid == 0 and auth_file.stat().st_mode & 0o777 == 0o600
    r = as_user(alice, "cat", str(auth_file))
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    assert not any(s in r.stdout for s in secrets)

    # Neither a container job nor a native job of the tenant gets them: environment, files, log.
    probe = (f"env\necho ---\ncat {auth_file} 2>&1 || echo no-auth-file\n"
             "cat \"${REGISTRY_AUTH_FILE:-/nonexistent}\" 2>&1 || echo no-registry-auth-file\n"
             "ls -a \"${XDG_RUNTIME_DIR:-/nonexistent}/containers\" 2>&1\necho probe-done\n")
    cjob = rnode.submit_json(alice, script=f"#MTGPU container={ref}\n" + probe)["job_id"]
    njob = rnode.submit_json(alice, script="#!/bin/sh\n" + probe)["job_id"]
    for jid, kind in ((cjob, "container"), (njob, "native")):
        job = finished(rnode, jid)
        out = log_of(rnode, alice, jid)
        assert job["state"] == "completed" and "probe-done" in out, (kind, job["reason"][:800], out)
        assert "no-auth-file" in out and "no-registry-auth-file" in out, (kind, out)
        assert "REGISTRY_AUTH_FILE=" not in out, (kind, out)
        for s in secrets:
            assert s not in out, f"the {kind} job's log shows the registry credentials:\n{out}"
            assert s not in str(job), f"the {kind} job's record shows the registry credentials: {job}"
    assert "Permission denied" in log_of(rnode, alice, njob)  # the native job reached the file, and was refused

    # The tenant's own podman has no login for the registry, and cannot pull from it.
    r = mt_podman(rnode, alice, "login", "--get-login", registry.host)
    assert r.returncode != 0 and "not logged in" in r.stderr, r
    r = mt_podman(rnode, alice, "pull", "--quiet", ref)
    assert r.returncode != 0 and ("unauthorized" in r.stderr or "authentication required" in r.stderr), r

    # Nothing a tenant can read on the node carries them: the staged archives, the server's log.
    for p in (rnode.state_dir / "images").iterdir():
        if p.is_file():
            data = p.read_bytes()
            assert not any(s.encode() in data for s in secrets), p
    log = "\n".join(p.read_text(errors="replace") for p in rnode.log_files)
    assert not any(s in log for s in secrets), "the server's log shows the registry credentials"


@pytest.mark.parametrize("mode", [0o644, 0o640], ids=["0644", "0640"])
def test_an_auth_file_others_can_read_keeps_the_server_from_starting(registry, mode):
    loose = registry.write_auth_file(registry.base / f"loose-{mode:o}.json", mode=mode)
    gets = registry.manifest_gets(REPO)
    try:
        with running_node(GPUS, start=False, CONTAINERS={"enabled": True, "images": [registry.ref(REPO)],
                                                         "registry_auth_file": str(loose)}) as node:
            node.start(wait=False)
            try:
                rc = node.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the server kept running with a {mode:o} auth file:\n{node.server_log()}") from None
            log = node.server_log()
            assert rc == 2, (rc, log)
            assert str(loose) in log and f"{mode:o}" in log, log
            assert f"chmod 600 {loose}" in log, log
            assert not node.socket_path.exists()
            assert not any(s in log for s in (registry.password, registry.auth))
    finally:
        loose.unlink(missing_ok=True)
    assert registry.manifest_gets(REPO) == gets  # nothing was pulled with it


def test_a_wrong_password_fails_the_image_and_its_jobs_while_the_node_keeps_running(registry, alice):
    ref = registry.ref(DENIED)
    wrong = "not-the-password"
    bad = registry.write_auth_file(registry.base / "wrong-password.json", password=wrong)
    try:
        with running_node(GPUS, CONTAINERS={"enabled": True, "images": [ref],
                                            "registry_auth_file": str(bad)}) as node:
            why = wait_for(f"{ref} to be reported failed",
                           lambda: (_containers(node).get("failed") or {}).get(ref), timeout_s=180, interval_s=0.2)
            # named, with podman's own message
            assert ref in why and "could not pull" in why, why
            assert "unauthorized" in why or "authentication required" in why, why
            assert wrong not in why and registry.password not in why
            c = _containers(node)
            assert ref not in (c.get("staged") or {}) and ref in c["images"], c
            assert not list((node.state_dir / "images").glob("sha256-*.tar"))

            # The node keeps running and serving: a native job runs.
            assert node.proc.poll() is None
            jid = node.submit_json(alice, "--wrap", "echo native-still-runs")["job_id"]
            assert finished(node, jid)["state"] == "completed"
            assert "native-still-runs" in log_of(node, alice, jid)

            # The image is offered by the node, so a job for it is accepted at submit, then fails
            # when it would start, its reason naming the image and why it could not be staged.
            r = node.mt_job(alice, "submit", "--json", "--container", ref, "--wrap", "echo must-not-run")
            assert r.returncode == 0, (r.returncode, r.stderr)
            jid = json.loads(r.stdout)["job_id"]
            job = finished(node, jid)
            assert job["state"] == "failed", job
            reason = job["reason"]
            assert ref in reason and "could not be staged" in reason, reason
            assert "unauthorized" in reason or "authentication required" in reason, reason
            assert wrong not in reason and registry.password not in reason
            r = node.mt_job(alice, "logs", str(jid))
            assert "must-not-run" not in r.stdout
            assert mt_podman(node, alice, "image", "exists", ref).returncode != 0
            assert node.proc.poll() is None
    finally:
        bad.unlink(missing_ok=True)


def test_another_tenant_sees_nothing_of_a_tenants_registry_image_or_container(rnode, registry, alice, bob):
    ref = registry.ref(REPO)
    flag = Path(alice.home) / "go-registry-isolation"
    jid = rnode.submit_json(alice, "--container", ref, "--wrap",
                            f"echo started; while [ ! -e {flag} ]; do sleep 0.1; done; echo done")["job_id"]
    try:
        wait_for("alice's job to start", lambda: "started" in log_of(rnode, alice, jid), timeout_s=120, interval_s=0.2)

        def alices_container():
            r = mt_podman(rnode, alice, "ps", "--filter", f"label=mtgpu.job={jid}", "--format", "{{.Names}}")
            return r.stdout.strip()

        name = wait_for("alice's container", alices_container, timeout_s=60, interval_s=0.2)
        r = mt_podman(rnode, alice, "images", "--filter", f"reference={ref}", "--format", "{{.ID}}")
        assert r.returncode == 0 and r.stdout.strip(), r
        image_id = r.stdout.split()[0]

        r = mt_podman(rnode, bob, "images", "--all", "--no-trunc", "--format", "{{.Repository}}:{{.Tag}} {{.ID}}")
        assert r.returncode == 0, r
        assert registry.host not in r.stdout and image_id not in r.stdout, r.stdout
        r = mt_podman(rnode, bob, "ps", "-a", "--format", "{{.Names}} {{.Image}} {{.Labels}}")
        assert r.returncode == 0, r
        assert r.stdout.strip() == "", r.stdout
        assert mt_podman(rnode, bob, "container", "exists", name).returncode != 0
        assert mt_podman(rnode, bob, "image", "exists", ref).returncode != 0
        r = mt_podman(rnode, bob, "run", "--rm", "--pull=never", "--network=none", ref, "true")
        assert r.returncode != 0, r
        # and alice still sees both: what bob does not see is there
        assert name in mt_podman(rnode, alice, "ps", "-a", "--format", "{{.Names}}").stdout
    finally:
        flag.touch()
    job = finished(rnode, jid)
    flag.unlink(missing_ok=True)
    assert job["state"] == "completed" and "done" in log_of(rnode, alice, jid), job["reason"][:800]
