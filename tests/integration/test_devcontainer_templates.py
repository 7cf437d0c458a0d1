"""Real devcontainer.json files on real rootless Podman as a real tenant (issue 24, points 7
and 8): `${containerEnv:PATH}` in remoteEnv, the VS Code Dev Containers templates as they are
written (tests/fixtures/devcontainer/template-*, whose sources are in their README), the
debugger's SYS_PTRACE and seccomp=unconfined, and a local Feature built into the image.

No registry is reachable here, so the templates' images (mcr.microsoft.com/devcontainers/...)
are mapped onto the node's staged busybox image: the test rewrites the `image` (and a
Dockerfile's FROM) of its copy of each template to that image's name, and nothing else."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from mtgpu.workspaces.jsonc import loads_jsonc
from mtgpu.workspaces.variables import PODMAN_DEFAULT_PATH
from tests.integration.test_workspaces import _staged, image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import running_node, wait_for

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer"


def _owned(user, project: Path) -> Path:
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(project)], check=True)
    return project


def _project(user, name: str, config: dict, files: dict[str, str] | None = None) -> Path:
    project = Path(user.home) / name
    (project / ".devcontainer").mkdir(parents=True)
    (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
    for rel, text in (files or {}).items():
        (project / ".devcontainer" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / ".devcontainer" / rel).write_text(text)
    return _owned(user, project)


def _exec(node, user, ws: str, script: str) -> str:
    r = mtc(node, user, "exec", ws, "--", "sh", "-c", script)
    assert r.returncode == 0, (r.stdout, r.stderr, node.server_log()[-2000:])
    return r.stdout


def test_remote_env_reads_the_images_path_through_container_env(wnode, alice, image):
    project = _project(alice, "cenv", {
        "name": "cenv", "build": {"dockerfile": "Dockerfile"},
        "containerEnv": {"TOOLS": "/opt/tools"},
        "remoteEnv": {"PATH": "${containerEnv:PATH}:/x", "TOOLBIN": "${containerEnv:TOOLS}/bin",
                      "MISSING": "${containerEnv:NOT_SET:dflt}"},
    }, {"Dockerfile": f"FROM {image}\nENV PATH=/opt/tools/bin:/usr/bin:/bin\n"})
    mtc_json(wnode, alice, "create", "--devcontainer", str(project))
    running(wnode, alice, "cenv")
    out = _exec(wnode, alice, "cenv", 'echo "$PATH"; echo "$TOOLBIN"; echo "$MISSING"')
    assert out.split() == ["/opt/tools/bin:/usr/bin:/bin:/x", "/opt/tools/bin", "dflt"], out
    r = mtc(wnode, alice, "exec", "cenv", "--", "sh", "-c", "exit 7")  # a bare `sh`, found through that PATH
    assert r.returncode == 7, (r.returncode, r.stderr)
    assert mtc(wnode, alice, "rm", "cenv").returncode == 0


# ------------------------------------------------ the templates as written (point 8)

TEMPLATES = sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith("template-")) + ["debugger-keys"]
DEBUGGER = ("template-cpp-2022", "template-go-2022", "template-rust-2022", "debugger-keys")
CAP_SYS_PTRACE = 19
# the mcr.microsoft.com images have the user vscode that the 2022 templates connect as; the stand-in gets it
VSCODE_USER = "RUN echo 'vscode:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd && echo 'vscode:x:1000:' >> /etc/group\n"


def _mapped_template(user, name: str, image: str, dest: str | None = None) -> Path:
    """The template's copy in the tenant's home, its registry image mapped onto the staged one."""
    project = Path(user.home) / (dest or name)
    shutil.copytree(FIXTURES / name, project)
    config = project / ".devcontainer" / "devcontainer.json"
    text, n = re.subn(r'"image":\s*"[^"]+"', f'"image": "{image}"', config.read_text())
    config.write_text(text)
    dockerfile = project / ".devcontainer" / "Dockerfile"
    if dockerfile.exists():
        text, m = re.subn(r"^FROM \S+", f"FROM {image}", dockerfile.read_text(), flags=re.M)
        dockerfile.write_text(text + VSCODE_USER)
        n += m
    assert n == 1, f"{name}: expected one image to map, found {n}"
    return _owned(user, project)


def _status(node, user, ws: str) -> dict[str, str]:
    out = _exec(node, user, ws, "cat /proc/self/status")
    return dict(line.split(":\t", 1) for line in out.splitlines() if ":\t" in line)


def test_the_vs_code_templates_as_written_make_working_workspaces(wnode, alice, image):
    for name in TEMPLATES:
        project = _mapped_template(alice, name, image)
        r = mtc(wnode, alice, "create", "--devcontainer", str(project), "--name", name, "--json", timeout_s=300)
        assert r.returncode == 0, (name, r.stdout, r.stderr, wnode.server_log()[-2000:])
    for name in TEMPLATES:
        running(wnode, alice, name)
        out = _exec(wnode, alice, name, 'echo "ok $(pwd)"; echo "$PATH"')
        assert out.splitlines()[0] == f"ok /workspaces/{name}", (name, out)
        status = _status(wnode, alice, name)
        has_ptrace = bool(int(status["CapEff"], 16) >> CAP_SYS_PTRACE & 1)
        assert has_ptrace == (name in DEBUGGER), (name, status["CapEff"])
        assert (status["Seccomp"] == "0") == (name in DEBUGGER), (name, status["Seccomp"])  # 2: filtered
    assert _exec(wnode, alice, "template-cpp", "cat /etc/cpp-template").strip() == "cpp-template-built"
    cuda = _exec(wnode, alice, "template-cuda", 'echo "$PATH"; echo "$LD_LIBRARY_PATH"').split()
    assert cuda[0].endswith(":/usr/local/cuda/bin") and "${" not in cuda[0] and cuda[1] == ":/usr/local/cuda/lib64", cuda
    assert _exec(wnode, alice, "template-go-2022", "id -un").strip() == "vscode"
    # remoteUser root: root inside is the tenant, and what it writes in the home is the tenant's
    assert _exec(wnode, alice, "template-cuda", f"id -u; touch {alice.home}/from-cuda").strip() == "0"
    assert (Path(alice.home) / "from-cuda").stat().st_uid == alice.uid
    for name in TEMPLATES:
        assert mtc(wnode, alice, "rm", name).returncode == 0, name


# ------------------------------------------------ a debugger's options grant nothing outside (point 8)

UNSHARE_PROBE = """
import sys
for pid in sys.argv[1:]:
    seen = []
    for what in ("mem", "maps"):  # maps is 0444: only the ptrace check stands in its way
        try:
            open(f"/proc/{pid}/{what}", "rb").close()
            seen.append("open")
        except OSError as e:
            seen.append(type(e).__name__)
    print(pid, *seen)
print("CapEff", open("/proc/self/status").read().split("CapEff:")[1].split()[0])
"""


def test_sys_ptrace_and_seccomp_unconfined_reach_nothing_outside_the_tenants_namespace(wnode, alice, bob, image):
    dbg = _mapped_template(alice, "debugger-keys", image, dest="dbg-proj")
    plain = _project(alice, "plain-ws", {"image": image})
    assert mtc(wnode, alice, "create", "--devcontainer", str(dbg), "--name", "dbg").returncode == 0
    assert mtc(wnode, alice, "create", "--devcontainer", str(plain), "--name", "plain").returncode == 0
    host = {}
    try:
        host["root"] = subprocess.Popen(["sleep", "613"])
        host["bob"] = subprocess.Popen(["sleep", "614"], user=bob.uid, group=bob.gid, extra_groups=[], cwd="/")
        host["alice"] = subprocess.Popen(["sleep", "615"], user=alice.uid, group=alice.gid, extra_groups=[], cwd="/")
        probe = {}
        for name in ("dbg", "plain"):
            container = running(wnode, alice, name)["workspace"]["container"]
            # a process of another uid in the container: container root, as mt-podman lets the tenant start it
            r = wnode.run_cli("mtgpu.cli.podman", alice, "exec", "-d", "--user", "0", container, "sleep", "616")
            assert r.returncode == 0, r.stderr
            probe[name] = _exec(wnode, alice, name, (
                "pid_of() { grep -l \"sleep.$1\" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3; }; "
                "for i in $(seq 100); do p=$(pid_of '61[6]') && [ -n \"$p\" ] && break; sleep 0.1; done; "
                "cat /proc/$p/maps 2>&1 | head -1; "
                "for c in '61[3]' '61[4]' '61[5]'; do pid_of \"$c\"; done; echo end; "
                # @0 could never be set (it is before boot): harmless even if the kernel said yes
                "date -s @0 2>&1 >/dev/null; mount -t tmpfs none /tmp 2>&1; hostname other 2>&1; true"))
        # the capability works inside: a debugger reads container root's process (maps, mode 0444, is
        # gated by ptrace access alone), a workspace without it cannot
        assert "Permission denied" not in probe["dbg"].splitlines()[0] and "sleep" not in probe["dbg"], probe["dbg"]
        assert "Permission denied" in probe["plain"].splitlines()[0], probe["plain"]
        # and nothing outside is even there: no host process is in its /proc; the kernel still says no
        # to what needs more than the namespace's own capabilities, seccomp filter or not
        lines = probe["dbg"].splitlines()
        assert lines[1] == "end", probe["dbg"]
        assert all("not permitted" in line.lower() or "permission denied" in line.lower() for line in lines[2:5]), lines
        # the tenant's own user namespace with every capability (podman unshare: SYS_PTRACE included) and
        # the host's processes in view: root's, bob's and even the tenant's own stay closed (a capability
        # counts only in its own namespace), where the tenant natively opens its own
        pids = [str(host[k].pid) for k in ("root", "bob", "alice")]
        r = wnode.run_cli("mtgpu.cli.podman", alice, "unshare", sys.executable, "-c", UNSHARE_PROBE, *pids)
        assert r.returncode == 0, r.stderr
        seen = dict(line.split(" ", 1) for line in r.stdout.splitlines())
        assert int(seen.pop("CapEff"), 16) >> CAP_SYS_PTRACE & 1, r.stdout
        closed = "PermissionError PermissionError"
        assert seen == dict.fromkeys(pids, closed), r.stdout
        native = subprocess.run([sys.executable, "-c", UNSHARE_PROBE, *pids], user=alice.uid, group=alice.gid,
                                extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60)
        seen = dict(line.split(" ", 1) for line in native.stdout.splitlines())
        assert (seen[pids[0]], seen[pids[1]], seen[pids[2]]) == (closed, closed, "open open"), native.stdout
    finally:
        for p in host.values():
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        for name in ("dbg", "plain"):
            mtc(wnode, alice, "rm", name)


# ------------------------------------------------ local Features (point 8)


def test_a_local_feature_is_built_into_the_image_with_its_options(wnode, alice, image):
    project = Path(alice.home) / "feat"
    shutil.copytree(FIXTURES / "local-feature", project)
    config = project / ".devcontainer" / "devcontainer.json"
    config.write_text(config.read_text().replace("localhost/base:1", image))
    _owned(alice, project)
    ws = mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "feat")
    assert ws["workspace"]["image"].endswith("-features:latest") and ws["spec"]["server"] == "node-a", ws
    running(wnode, alice, "feat")
    out = _exec(wnode, alice, "feat", "hello; cat /opt/hello/installed-by; echo $HELLO_HOME; id -un")
    # the user's option over the default, a default, the remote user; install.sh ran as root; ENV in the image
    assert out.splitlines() == ["hey false dev", "0", "/opt/hello", "dev"], out
    status = _status(wnode, alice, "feat")
    assert int(status["CapEff"], 16) >> CAP_SYS_PTRACE & 1, status  # the Feature's own capAdd
    assert mtc(wnode, alice, "rm", "feat").returncode == 0


def test_a_registry_feature_is_refused_naming_it_before_any_build(wnode, alice, image):
    project = _project(alice, "regfeat", {"image": image, "features": {
        "./local": {}, "ghcr.io/devcontainers/features/node:1": {"version": "lts"}}})
    r = mtc(wnode, alice, "create", "--devcontainer", str(project))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "the Feature ghcr.io/devcontainers/features/node:1 comes from a registry" in r.stderr, r.stderr
    assert 'name it "./node"' in r.stderr, r.stderr
    assert not mtc_json(wnode, alice, "list")


# ------------------------------------------------ Features an admin staged (point 8)

GREETER = "ghcr.io/mtgpu-test/features/greeter:1"
BASE_TOOLS = "ghcr.io/mtgpu-test/features/base-tools:1"


def _feature_archive(path: Path, meta: dict, install: str) -> str:
    """A Feature's archive as a registry serves it (its folder, tar.gz), root's file, as an admin stages it."""
    folder = path.with_suffix(".d")
    folder.mkdir()
    (folder / "devcontainer-feature.json").write_text(json.dumps(meta))
    (folder / "install.sh").write_text("#!/bin/sh\nset -e\n" + install)
    subprocess.run(["tar", "-C", str(folder), "-czf", str(path), "."], check=True)
    os.chmod(path, 0o644)
    return str(path)


def test_a_staged_registry_feature_is_built_into_the_image_as_a_local_one(alice, image, base):
    """[CONTAINERS] features stages two registry Features' archives; a devcontainer.json names one
    (with an option), a local Feature that installsAfter it, and a registry Feature not staged.
    The unstaged one is refused naming the key that stages it; without it, the staged one is
    built as a local one is: its dependsOn (staged too) first, its options, install.sh as root,
    its containerEnv in the image; then the local one."""
    staged = {
        GREETER: _feature_archive(base / "greeter.tgz", {
            "id": "greeter", "options": {"greeting": {"type": "string", "default": "hello"}},
            "containerEnv": {"GREETER_HOME": "/opt/greeter"}, "dependsOn": {BASE_TOOLS: {"flavor": "plain"}}},
            'mkdir -p /opt/greeter && id -u > /opt/greeter/installed-by && echo "greeter $GREETING" >> /feature-order\n'),
        BASE_TOOLS: _feature_archive(base / "base-tools.tgz", {
            "id": "base-tools", "options": {"flavor": {"type": "string", "default": "full"}}},
            'echo "base-tools $FLAVOR" >> /feature-order\n'),
    }
    with running_node([], CONTAINERS={"enabled": True, "templates": {"plain": image}, "allow_user_images": True,
                                      "features": staged}) as node:
        wait_for("the image to be staged", lambda: image in _staged(node), timeout_s=120)
        hello = {"hello/devcontainer-feature.json": json.dumps({"id": "hello", "installsAfter": [GREETER.split(":")[0]]}),
                 "hello/install.sh": '#!/bin/sh\necho "hello $_REMOTE_USER" >> /feature-order\n'}
        config = {"image": image, "features": {"./hello": {}, GREETER: {"greeting": "hey"},
                                               "ghcr.io/devcontainers/features/node:1": {}}}
        project = _project(alice, "staged", config, hello)
        r = mtc(node, alice, "create", "--devcontainer", str(project))
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert ("the Feature ghcr.io/devcontainers/features/node:1 comes from a registry, which this node cannot "
                "reach, and it is not staged here: an admin can stage its archive on this node ([CONTAINERS] features = "
                '{ "ghcr.io/devcontainers/features/node:1" = ') in r.stderr, r.stderr
        assert "greeter" not in r.stderr and "building" not in r.stderr, r.stderr
        del config["features"]["ghcr.io/devcontainers/features/node:1"]
        (project / ".devcontainer" / "devcontainer.json").write_text(json.dumps(config))
        r = mtc(node, alice, "create", "--devcontainer", str(project), "--name", "staged", "--json", timeout_s=300)
        assert r.returncode == 0, (r.stdout, r.stderr, node.server_log()[-2000:])
        assert json.loads(r.stdout)["workspace"]["image"].endswith("-features:latest"), r.stdout
        running(node, alice, "staged")
        out = _exec(node, alice, "staged", "cat /feature-order; cat /opt/greeter/installed-by; echo $GREETER_HOME")
        assert out.splitlines() == ["base-tools plain", "greeter hey", "hello root", "0", "/opt/greeter"], out
        assert mtc(node, alice, "rm", "staged").returncode == 0


# ------------------------------------------------ ${containerEnv:...} in lifecycle commands, Feature order


def test_lifecycle_commands_read_the_containers_environment(wnode, alice, image):
    """The fixture lifecycle-container-env (every hook; string, list and object forms) made into
    a workspace: its commands ran with ${containerEnv:...} substituted as the reference's
    `devcontainer run-user-commands` does (the fixture's comment), for this image, which sets no
    Env: podman's PATH, containerEnv's names, the defaults for the rest. Before, busybox sh was
    handed the text and made it nothing."""
    config = loads_jsonc((FIXTURES / "lifecycle-container-env" / ".devcontainer" / "devcontainer.json").read_text())
    project = _project(alice, "lifeenv", {**config, "image": image})
    mtc_json(wnode, alice, "create", "--devcontainer", str(project), "--name", "lifeenv")
    running(wnode, alice, "lifeenv")
    out = _output_with(wnode, alice, "lifeenv", "cat /tmp/out", "attach=")
    assert out.split("\n")[:-1] == ["on=over/c1/dflt/d2//", "post=c1", "start=over", f"attach={PODMAN_DEFAULT_PATH}"], out
    assert mtc(wnode, alice, "rm", "lifeenv").returncode == 0


def test_local_features_install_in_the_specifications_order(wnode, alice, image):
    """The fixture feature-order (installsAfter by path, a dependsOn on a Feature also given, one
    on a Feature not given, with options of its own) built into the image: each install.sh
    appended its name and $GREETING to /feature-order, in the order @devcontainers/cli 0.89.0
    built the same folder in (the fixture's comment). Before, the dependsOn was refused."""
    project = Path(alice.home) / "order"
    shutil.copytree(FIXTURES / "feature-order", project)
    config = project / ".devcontainer" / "devcontainer.json"
    config.write_text(config.read_text().replace("localhost/base:1", image))
    _owned(alice, project)
    r = mtc(wnode, alice, "create", "--devcontainer", str(project), "--name", "order", "--json", timeout_s=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    running(wnode, alice, "order")
    out = _exec(wnode, alice, "order", "cat /feature-order")
    assert [line.strip() for line in out.splitlines()] == ["delta asked-by-zeta", "gamma", "beta", "zeta", "alpha"], out
    assert mtc(wnode, alice, "rm", "order").returncode == 0


def _output_with(node, user, ws: str, script: str, holding: str) -> str:
    """The output of `script` in the workspace once it holds `holding` (its lifecycle commands ran)."""
    return wait_for(f"{holding!r} in the output of {script!r}",
                    lambda: (r := mtc(node, user, "exec", ws, "--", "sh", "-c", script)).returncode == 0
                    and holding in r.stdout and r.stdout, timeout_s=60, interval_s=0.3)
