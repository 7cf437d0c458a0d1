"""A WSL2 host's Windows drives hidden from tenants, for real, on a stand-in.

No WSL takes part, so the test makes one's two tell-tales in a private mount namespace
(`unshare --mount`: nothing it mounts is seen by the machine, and all of it goes when
the namespace's last process ends):

- a WSL kernel release string, bind-mounted over /proc/sys/kernel/osrelease, which
  `Platform.probe()` then reads as a WSL2 host;
- a Windows drive: an NTFS image mounted with ntfs-3g as WSL mounts drvfs, owned by one
  user (the WSL account) and open to everyone (`umask=000`, drvfs's default). This
  machine's kernel has no vfat (and no modules), so the stand-in is ntfs-3g (FUSE), which
  takes the same uid=/gid=/umask=/fmask=/dmask= options as drvfs; it is named a Windows
  drive to the code by the predicate WindowsDrives takes (its fstype is `fuse`).

Then the install's Windows-drive steps run (the same objects `mtgpu-setup install` plans
on a WSL host), and real processes of a real tenant user and of the owner try the drive
before and after. The namespace's side runs this file as a script (`__main__`) and
reports what it saw as JSON; the test asserts on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

WSL_RELEASE = "5.15.167.4-microsoft-standard-WSL2"
SECRET = "the Windows user's own file\n"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "mount namespaces and mounts need root"
    for tool in ("unshare", "ntfs-3g", "mkntfs", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (ntfs-3g: the Debian package ntfs-3g)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing (the stand-in drive is a FUSE mount)"
    return None


# ---------------------------------------------------------------- inside the namespace (a script)


def _try(user: tuple[int, int], cmd: list[str]) -> dict:
    r = subprocess.run(cmd, user=user[0], group=user[1], extra_groups=[], capture_output=True, text=True,
                       timeout=20, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, cwd="/")
    return {"rc": r.returncode, "out": r.stdout, "err": r.stderr.strip()}


def _access(mnt: Path, owner: tuple[int, int], tenant: tuple[int, int]) -> dict:
    secret = str(mnt / "Users" / "secret.txt")
    return {"tenant_ls": _try(tenant, ["ls", str(mnt)]), "tenant_cat": _try(tenant, ["cat", secret]),
            "tenant_write": _try(tenant, ["touch", str(mnt / "tenant-was-here")]),
            "owner_ls": _try(owner, ["ls", str(mnt / "Users")]), "owner_cat": _try(owner, ["cat", secret]),
            "owner_write": _try(owner, ["touch", str(mnt / "Users" / "owner-wrote-this")])}


def _ntfs_pids(img: Path) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                if argv and argv[0].endswith(b"ntfs-3g") and str(img).encode() in argv:
                    pids.append(int(name))
    return pids


def in_namespace(spec: dict) -> dict:
    from mtgpu.setup.layout import Layout
    from mtgpu.setup.plan import run_plan
    from mtgpu.setup.service import Platform
    from mtgpu.setup.status import gather_status, status_lines
    from mtgpu.setup.wsl_drives import WindowsDrives

    base = Path(spec["base"])
    img, mnt, root = base / "c.img", base / "mnt" / "c", base / "root"
    owner, tenant = tuple(spec["owner"]), tuple(spec["tenant"])
    subprocess.run(["mount", "--bind", str(base / "osrelease"), "/proc/sys/kernel/osrelease"], check=True)
    subprocess.run(["ntfs-3g", str(img), str(mnt), "-o", f"uid={owner[0]},gid={owner[1]},umask=000"], check=True)
    (base / "pids").write_text(json.dumps(_ntfs_pids(img)))  # for the test to kill, should this process die
    report: dict = {}
    try:
        (mnt / "Users").mkdir()
        (mnt / "Users" / "secret.txt").write_text(SECRET)
        platform = Platform.probe()
        report["wsl"] = platform.wsl
        report["before"] = _access(mnt, owner, tenant)
        drives = WindowsDrives(Layout.make(root).wsl_conf, live=True, is_drive=lambda m: m.target == str(mnt),
                               remount_as=lambda m: ("ntfs-3g", m.source))
        report["status_before"] = drives.status()
        steps = drives.hide_steps() if spec["choice"] == "hidden" else drives.unhide_steps("--windows-drives open")
        plan: list[str] = []
        run_plan(steps, yes=True, ask=lambda q: False, out=plan.append)
        report["plan"] = plan
        report["after"] = _access(mnt, owner, tenant)
        rerun: list[str] = []
        run_plan(steps, yes=True, ask=lambda q: False, out=rerun.append)
        report["rerun"] = rerun
        doc = gather_status(root, platform=platform, windows_drives=drives)
        report["status"] = doc["windows_drives"]
        report["status_lines"] = status_lines(doc)
        report["mountinfo"] = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
                               if str(mnt) in line]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    return report


# ---------------------------------------------------------------- the tests


def _stand_in(base: Path) -> None:
    os.chmod(base, 0o755)  # tenants walk to the drive, as to /mnt/c
    (base / "osrelease").write_text(WSL_RELEASE + "\n")
    (base / "mnt" / "c").mkdir(parents=True)
    os.chmod(base / "mnt", 0o755)
    (base / "root").mkdir()
    with open(base / "c.img", "wb") as f:
        f.truncate(8 << 20)
    subprocess.run(["mkntfs", "-F", "-f", "-q", "-L", "C", str(base / "c.img")], check=True, capture_output=True)


def run_stand_in(owner, tenant, choice: str) -> dict:
    from tests.support.node import REPO_ROOT

    base = Path(tempfile.mkdtemp(prefix="mtgpu-wsl-it-"))
    try:
        _stand_in(base)
        spec = {"base": str(base), "owner": [owner.uid, owner.gid], "tenant": [tenant.uid, tenant.gid],
                "choice": choice}
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, __file__,
                            json.dumps(spec)], capture_output=True, text=True, timeout=60,
                           env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                                "PYTHONPATH": REPO_ROOT, "LANG": "C.UTF-8"})
        assert r.returncode == 0, f"the namespace's side failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        report = json.loads(r.stdout)
        report["wsl_conf"] = (base / "root/etc/wsl.conf").read_text() if (base / "root/etc/wsl.conf").exists() \
            else None
        return report
    finally:
        with contextlib.suppress(OSError, ValueError):
            for pid in json.loads((base / "pids").read_text()):  # only if the namespace's side died mid-way
                if str(base).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def people(temp_user_factory):
    """The WSL account that owns the drive (uid 1000 on a real WSL), and a tenant."""
    why = _why_not()
    if why:
        pytest.skip(why)
    return temp_user_factory("mtwo"), temp_user_factory("mtwt")


def _nothing_leaked() -> None:
    assert Path("/proc/sys/kernel/osrelease").read_text().strip() != WSL_RELEASE
    assert "mtgpu-wsl-it-" not in Path("/proc/self/mountinfo").read_text()


def test_on_a_wsl_host_the_open_windows_drive_is_hidden_from_a_tenant_and_its_owner_keeps_it(people):
    owner, tenant = people
    r = run_stand_in(owner, tenant, "hidden")
    _nothing_leaked()
    assert r["wsl"] is True  # the injected release string makes Platform.probe() see WSL2
    before, after = r["before"], r["after"]
    assert before["tenant_ls"]["rc"] == 0 and "Users" in before["tenant_ls"]["out"]
    assert before["tenant_cat"] == {"rc": 0, "out": SECRET, "err": ""}  # open, as drvfs is by default
    assert r["status_before"]["open"] and "0777" in r["status_before"]["drives"][0]["why"]
    assert len(r["plan"]) == 2 and "umask=077" in r["plan"][0] and "mounted again: owner-only (mode 0700)" in \
        r["plan"][1] and f"owner uid {owner.uid}" in r["plan"][1], r["plan"]
    for what in ("tenant_ls", "tenant_cat", "tenant_write"):
        assert after[what]["rc"] != 0 and "Permission denied" in after[what]["err"], (what, after[what])
    assert after["owner_ls"]["rc"] == 0 and "secret.txt" in after["owner_ls"]["out"]
    assert after["owner_cat"]["out"] == SECRET and after["owner_write"]["rc"] == 0
    assert 'options = "umask=077"' in r["wsl_conf"].splitlines() and "[automount]" in r["wsl_conf"]
    assert all("already done" in line for line in r["rerun"][:2]) and r["rerun"][-1].startswith("nothing changed")
    assert r["status"]["open"] == [] and r["status"]["wsl_conf_hides"]
    assert any("drives hidden from tenants (owner-only)" in line for line in r["status_lines"]), r["status_lines"]
    assert len(r["mountinfo"]) == 1  # mounted once, again, not stacked


def test_with_the_opt_out_nothing_changes_and_status_says_the_drive_is_open(people):
    owner, tenant = people
    r = run_stand_in(owner, tenant, "open")
    _nothing_leaked()
    assert r["wsl"] is True
    assert r["plan"][0].endswith("already done (none there)") and r["plan"][-1].startswith("nothing changed")
    assert r["after"]["tenant_cat"] == {"rc": 0, "out": SECRET, "err": ""}
    assert r["wsl_conf"] is None  # not even created
    assert r["status"]["open"] and any("drives OPEN to every tenant" in line for line in r["status_lines"])


if __name__ == "__main__":
    print(json.dumps(in_namespace(json.loads(sys.argv[1]))))
