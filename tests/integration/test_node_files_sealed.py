"""The node's own files that a container mounts (a container job's script, a workspace's
entry script) sit in a job folder of root's, below folders of root's only, so that the
tenant cannot swap one for a symlink between the node's write and runc's mount (issue 24):
podman mounts them by path, and a kept workspace's container follows the path again at
every `podman start`. A process of the tenant's tries the swap (a symlink to the GPUs'
device folder renamed over the file, the file renamed away or removed) in a loop while
the workspace starts again and again; every try is refused by the kernel, and the
container runs the node's entry. Before, the folder was the tenant's (0700) and the swap
went through."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from tests.integration.test_workspaces import image, mtc, mtc_json, running, wnode  # noqa: F401 (fixtures)
from tests.support.node import wait_for


def _components(path: Path) -> list[tuple[str, int, int, int]]:
    """(path, uid, gid, mode) of every folder from / down to `path`'s folder, then of `path`."""
    out, p = [], Path("/")
    for part in path.parts[1:]:
        st = os.lstat(p)
        out.append((str(p), st.st_uid, st.st_gid, st.st_mode))
        p = p / part
    st = os.lstat(path)
    out.append((str(path), st.st_uid, st.st_gid, st.st_mode))
    return out


def _assert_sealed(path: Path, user) -> None:
    """Every folder above the node's file is root's and no one else may write it (or, like
    /tmp, is sticky, so that only an entry's owner may rename it: each entry below is
    root's); the file itself is a regular file (the tenant's, so that its container reads it)."""
    comps = _components(path)
    for (p, uid, _gid, mode), below in zip(comps[:-1], comps[1:]):
        assert stat.S_ISDIR(mode) and uid == 0, ("a folder above the node's file is not root's", p, uid, oct(mode))
        writable = mode & 0o022
        assert not writable or (mode & stat.S_ISVTX and below[1] == 0), \
            ("a folder above the node's file may be written by others", p, oct(mode), below)
    f, uid, _gid, mode = comps[-1]
    assert stat.S_ISREG(mode) and uid == user.uid and not mode & 0o077, (f, uid, oct(mode))


_SWAPPER = """
import errno, json, os, sys, time
folder, name, target, stop = sys.argv[1:5]
tries = {"done": 0, "refused": 0, "other": []}
end = time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < end:
    for attempt in ("link_over", "rename_away", "unlink"):
        try:
            if attempt == "link_over":
                os.symlink(target, os.path.join(folder, name + ".x"))
                os.rename(os.path.join(folder, name + ".x"), os.path.join(folder, name))
            elif attempt == "rename_away":
                os.rename(os.path.join(folder, name), os.path.join(folder, name + ".old"))
            else:
                os.unlink(os.path.join(folder, name))
            tries["done"] += 1
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                tries["refused"] += 1
            elif e.errno != errno.ENOENT:
                tries["other"].append(f"{attempt}: {e}")
    time.sleep(0.002)
print(json.dumps(tries))
"""


def _swapper(user, folder: Path, name: str, stop_file: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _SWAPPER, str(folder), name, "/dev/mtgpu", str(stop_file)],
                            user=user.uid, group=user.gid, extra_groups=[], cwd="/", stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _stopped(swapper: subprocess.Popen, stop_file: Path) -> dict:
    stop_file.touch()
    try:
        out, err = swapper.communicate(timeout=30)
    finally:
        if swapper.poll() is None:
            swapper.kill()
            swapper.wait()
    assert swapper.returncode == 0, err
    return json.loads(out)


def test_a_workspace_entry_file_cannot_be_swapped_while_the_workspace_starts(wnode, alice, image):
    mtc_json(wnode, alice, "create", "--image", image, "--name", "sealed")
    ws = running(wnode, alice, "sealed")
    folder = wnode.state_dir / "podman" / "jobs" / str(ws["id"])
    entry = folder / "entry"
    assert mtc_json(wnode, alice, "stop", "sealed")["state"] == "stopped"
    stop_file = Path(alice.home) / "swapper.stop"
    swapper = _swapper(alice, folder, "entry", stop_file)
    seen, unsealed = [], []
    try:
        for _ in range(3):  # podman start follows the stored source path again each time
            r = mtc(wnode, alice, "start", "sealed")
            if r.returncode != 0:
                seen.append(f"start failed: {(r.stdout + r.stderr).strip()[-300:]}")
                continue
            got = mtc(wnode, alice, "exec", "sealed", "--", "head", "-n", "2", "/.mtgpu/workspace-entry")
            seen.append(got.stdout)
            try:
                _assert_sealed(entry, alice)  # as the container runs
            except AssertionError as e:
                unsealed.append(str(e))
            assert mtc_json(wnode, alice, "stop", "sealed")["state"] == "stopped"
    finally:
        tries = _stopped(swapper, stop_file)
    assert tries["done"] == 0 and tries["refused"] > 0 and not tries["other"], ("the tenant swapped the node's "
                                                                                  "file", tries, seen)
    assert all("# written by mtgpu" in s for s in seen), seen
    assert not unsealed, unsealed
    assert entry.is_file() and not entry.is_symlink()
    assert mtc(wnode, alice, "rm", "sealed").returncode == 0


def test_a_workspace_folder_made_by_an_older_node_is_taken_back_and_a_replaced_entry_refused(wnode, alice, image):
    """A kept container's job folder from before (the tenant's, 0700) is made root's at the
    next start; an entry the tenant had already replaced with a symlink is refused, naming it."""
    mtc_json(wnode, alice, "create", "--image", image, "--name", "older")
    ws = running(wnode, alice, "older")
    assert mtc_json(wnode, alice, "stop", "older")["state"] == "stopped"
    folder = wnode.state_dir / "podman" / "jobs" / str(ws["id"])
    os.chown(folder, alice.uid, alice.gid)  # as an older node left it
    os.chmod(folder, 0o700)
    mtc(wnode, alice, "start", "older")
    running(wnode, alice, "older")
    _assert_sealed(folder / "entry", alice)
    assert mtc_json(wnode, alice, "stop", "older")["state"] == "stopped"
    os.chown(folder, alice.uid, alice.gid)
    os.chmod(folder, 0o700)
    r = subprocess.run(["sh", "-c", 'mv entry entry.old && ln -s /dev/mtgpu entry', "swap"], cwd=folder,
                       user=alice.uid, group=alice.gid, extra_groups=[], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    mtc(wnode, alice, "start", "older")
    job = wait_for("the start to be refused", lambda: "entry file" in ((j := wnode.job(ws["id"]))["reason"] or "")
                   and j, timeout_s=90, interval_s=0.3)
    assert f"the workspace's entry file {folder}/entry is no longer the node's" in job["reason"], job
    assert os.lstat(folder).st_uid == 0, "the folder was left the tenant's"
    assert mtc(wnode, alice, "rm", "older").returncode == 0


def test_a_container_jobs_script_sits_in_a_folder_the_tenant_cannot_write(wnode, alice, image):
    jid = wnode.submit_json(alice, script=f"#MTGPU container={image}\nsleep 300\n")["job_id"]
    wnode.wait_state(jid, "running", timeout_s=90)
    folder = wnode.state_dir / "podman" / "jobs" / str(jid)
    wait_for("the job's container", lambda: (folder / "script").is_file(), timeout_s=60)
    try:
        _assert_sealed(folder / "script", alice)
        r = subprocess.run(["sh", "-c", "ln -s /dev/mtgpu script.x && mv -f script.x script"], cwd=folder,
                           user=alice.uid, group=alice.gid, extra_groups=[], capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (r.returncode, r.stderr)
        assert (folder / "script").is_file() and not (folder / "script").is_symlink()
    finally:
        wnode.mt_job(alice, "cancel", str(jid))
    wnode.wait_state(jid, {"cancelled", "failed", "completed"}, timeout_s=90)
