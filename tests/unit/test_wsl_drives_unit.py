"""A WSL2 host's Windows drives (mtgpu/setup/wsl_drives.py): the mount table as WSL writes
it, which drives are open to tenants, the /etc/wsl.conf edits and their undo, and the
steps' flow with a stand-in runner (the real mounts: tests/integration/test_wsl_drives.py).
Nothing here touches the machine's own mounts or /etc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from mtgpu.setup.layout import Layout
from mtgpu.setup.plan import SetupRefused, StepFailed, run_plan
from mtgpu.setup.service import Platform
from mtgpu.setup.status import status_lines
from mtgpu.setup.wsl_drives import (MARK, WindowsDrives, check_choice, drive_letter, is_windows_drive, judge,
                                    parse_mountinfo, remount_options, wsl_conf_has_our_masks, wsl_conf_hides,
                                    wsl_conf_with_drive_masks, wsl_conf_without_drive_masks)
from tests.support.folders import traversable_folder

# Lines as WSL2 writes them (9p, the default; virtiofs with virtioFS=true) and as
# `mount -t drvfs` leaves them, with WSL's own non-drive mounts around them.
WSL_MOUNTINFO = r"""61 86 0:54 / /mnt/c rw,noatime - 9p C:\134 rw,dirsync,aname=drvfs;path=C:\;uid=1000;gid=1000;symlinkroot=/mnt/,mmap,access=client,msize=65536,trans=fd,rfd=5,wfd=5
83 86 0:37 / /usr/lib/wsl/drivers ro,nosuid,nodev,noatime - 9p drivers ro,aname=drivers;fmask=222;dmask=222,cache=0x5,access=client,msize=65536,trans=fd,rfd=8,wfd=8
82 86 0:35 / /mnt/wsl rw,relatime shared:1 - tmpfs none rw,huge=advise
64 86 0:60 / /mnt/d rw,noatime - drvfs D:\134 rw,noatime,uid=1000,gid=1000,metadata,umask=22,fmask=11,case=off
65 86 0:61 / /mnt/e rw,noatime shared:7 - virtiofs drvfsE0 rw
66 86 0:62 / /mnt/my\040share rw,noatime - 9p F:\134 rw,aname=drvfs;path=F:\;uid=1000;gid=1000;umask=077;fmask=077;dmask=077,trans=fd
"""


def mounts() -> dict:
    return {m.target: m for m in parse_mountinfo(WSL_MOUNTINFO)}


# ---------------------------------------------------------------- the mount table


def test_the_mount_table_is_read_as_wsl_writes_it_and_the_windows_drives_are_picked():
    ms = mounts()
    c = ms["/mnt/c"]
    assert (c.fstype, c.source, c.root) == ("9p", "C:\\", "/")
    assert c.drvfs_options == {"path": "C:\\", "uid": "1000", "gid": "1000", "symlinkroot": "/mnt/"}
    assert c.super_options["trans"] == "fd"  # 9p's own options are not drvfs's
    assert ms["/mnt/d"].drvfs_options["umask"] == "22" and "metadata" in ms["/mnt/d"].drvfs_options
    assert "/mnt/my share" in ms  # \040 is a space
    drives = sorted(t for t, m in ms.items() if is_windows_drive(m))
    assert drives == ["/mnt/c", "/mnt/d", "/mnt/e", "/mnt/my share"]  # not WSL's drivers share, not /mnt/wsl
    assert [drive_letter(ms[t]) for t in drives] == ["C:", "D:", "E:", "F:"]


def test_a_share_that_names_no_drive_has_no_letter_so_it_is_not_mounted_again_by_guess():
    [m] = parse_mountinfo("70 86 0:70 /3f2a /run/wsl/share rw - virtiofs drvfsa rw\n")
    assert is_windows_drive(m) and drive_letter(m) is None


def test_a_drive_is_mounted_again_with_its_owner_its_own_drvfs_options_and_owner_only_masks():
    ms = mounts()
    assert remount_options(ms["/mnt/c"], 1000, 1000) == ["uid=1000", "gid=1000", "umask=077", "fmask=077", "dmask=077"]
    assert remount_options(ms["/mnt/d"], 1000, 1000) == ["metadata", "case=off", "uid=1000", "gid=1000", "umask=077",
                                                         "fmask=077", "dmask=077"]


# ---------------------------------------------------------------- open or hidden


def test_a_drive_is_open_when_its_root_lets_others_in_or_its_drvfs_masks_do():
    ms = mounts()
    is_open, why = judge(ms["/mnt/c"], 0o40777, reachable=True)
    assert is_open and "0777" in why and "drvfs's default 000" in why
    is_open, why = judge(ms["/mnt/d"], 0o40700, reachable=True)  # the root is closed, but umask=22 opens folders
    assert is_open and "umask=22" in why
    is_open, why = judge(ms["/mnt/e"], 0o40755, reachable=True)  # virtiofs shows no options: stat decides
    assert is_open and "0755" in why
    assert judge(ms["/mnt/e"], 0o40700, reachable=True) == (False, "owner-only (mode 0700)")
    assert judge(ms["/mnt/my share"], 0o40700, reachable=True)[0] is False


def test_a_drive_others_cannot_reach_is_not_open_and_says_why():
    is_open, why = judge(mounts()["/mnt/c"], 0o40777, reachable=False)
    assert not is_open and "cannot reach /mnt/c" in why


# ---------------------------------------------------------------- /etc/wsl.conf

ADMIN_CONF = """# the admin's own comment
[boot]
command = service cron start

[automount]
enabled = true
options = "metadata,uid=1000,umask=22,fmask=11,case=off"
mountFsTab = false

[network]
hostname = lab-pc
"""


def test_the_masks_are_merged_into_the_automount_options_keeping_everything_else():
    out = wsl_conf_with_drive_masks(ADMIN_CONF)
    assert 'options = "metadata,uid=1000,umask=077,fmask=077,case=off"' in out.splitlines()
    assert f'{MARK} options = "metadata,uid=1000,umask=22,fmask=11,case=off"' in out.splitlines()
    for line in ADMIN_CONF.splitlines():
        if not line.startswith("options"):
            assert line in out.splitlines()  # comments, other sections and keys stay
    assert wsl_conf_hides(out) and not wsl_conf_hides(ADMIN_CONF)
    assert wsl_conf_with_drive_masks(out) == out  # idempotent
    assert wsl_conf_without_drive_masks(out) == ADMIN_CONF  # the undo takes out exactly what was put in


@pytest.mark.parametrize("text", ["", "[boot]\ncommand = /etc/init.d/mtgpu start\n", "[automount]\nenabled = true\n",
                                  "[automount]\n[user]\ndefault = me\n", "[automount]\noptions = metadata\n"])
def test_masks_go_in_where_there_were_none_and_the_undo_gives_the_file_back(text):
    out = wsl_conf_with_drive_masks(text)
    assert wsl_conf_hides(out) and wsl_conf_has_our_masks(out)
    assert "umask=077" in out
    assert wsl_conf_with_drive_masks(out) == out
    assert wsl_conf_without_drive_masks(out) == text


def test_options_that_hide_the_drives_already_are_left_alone():
    text = '[automount]\noptions = "metadata,umask=027"\n'
    assert wsl_conf_with_drive_masks(text) == text and not wsl_conf_has_our_masks(text)
    assert wsl_conf_without_drive_masks(text) == text  # nothing of ours to take out


def test_the_undo_keeps_what_the_admin_changed_since():
    out = wsl_conf_with_drive_masks("[automount]\nenabled = true\n")
    edited = out.replace('options = "umask=077"', 'options = "umask=077,case=dir"')
    assert wsl_conf_without_drive_masks(edited) == '[automount]\noptions = "case=dir"\nenabled = true\n'


def test_an_unknown_windows_drives_setting_is_refused_naming_the_flag_and_the_choices():
    assert check_choice(None) == "hidden" and check_choice("open") == "open"
    with pytest.raises(SetupRefused) as e:
        check_choice("visible")
    assert "--windows-drives 'visible'" in str(e.value) and "hidden, open" in str(e.value)


# ---------------------------------------------------------------- the steps, with a stand-in runner


class FakeMounts:
    """Targets are real folders (stat reads them); `mount` sets the folder's mode as masks would."""

    def __init__(self, tmp: Path, mode: int = 0o777, mount_works: bool = True, busy: bool = False) -> None:
        self.c = tmp / "mnt" / "c"
        self.c.mkdir(parents=True)
        os.chmod(tmp / "mnt", 0o755)
        os.chmod(self.c, mode)
        self.mountinfo = tmp / "mountinfo"
        self.mountinfo.write_text(WSL_MOUNTINFO.splitlines()[0].replace("/mnt/c", str(self.c)) + "\n")
        self.calls: list[list[str]] = []
        self.mount_works, self.busy = mount_works, busy

    def run(self, cmd, **kw):
        self.calls.append(cmd)
        if cmd[:2] == ["umount", str(self.c)] and self.busy:
            return subprocess.CompletedProcess(cmd, 32, "", "target is busy")
        if cmd[0] == "mount" and self.mount_works:
            os.chmod(self.c, 0o700)
            line = self.mountinfo.read_text().replace("uid=1000;gid=1000", "uid=1000;gid=1000;umask=077;fmask=077;"
                                                      "dmask=077")
            self.mountinfo.write_text(line)
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder others can walk through (pytest's tmp_path is not: a drive there is unreachable)."""
    with traversable_folder("mtgpu-wsl-unit-") as d:
        yield d


def drives_for(fake: FakeMounts, tmp: Path) -> WindowsDrives:
    return WindowsDrives(tmp / "etc" / "wsl.conf", live=True, mountinfo=fake.mountinfo, run=fake.run)


def test_the_steps_hide_an_open_drive_in_wsl_conf_and_now_and_a_rerun_changes_nothing(base):
    fake = FakeMounts(base)
    drives = drives_for(fake, base)
    assert [d.open for d in drives.drives()] == [True]
    lines: list[str] = []
    result = run_plan(drives.hide_steps(), yes=True, ask=lambda q: False, out=lines.append)
    assert len(result.applied) == 2, lines
    assert ["umount", str(fake.c)] in fake.calls
    assert ["mount", "-t", "drvfs", "C:", str(fake.c), "-o", "uid=1000,gid=1000,umask=077,fmask=077,dmask=077"] \
        in fake.calls
    assert "mounted again: owner-only (mode 0700)" in lines[1] and "owner uid 1000" in lines[1]
    assert 'options = "umask=077"' in (base / "etc/wsl.conf").read_text()
    assert drives.status()["open"] == []
    again: list[str] = []
    assert not run_plan(drives.hide_steps(), yes=True, ask=lambda q: False, out=again.append).changed
    assert all("already done" in line for line in again[:2]), again


def test_without_yes_the_drive_steps_are_asked_about_and_a_no_changes_nothing(base):
    fake = FakeMounts(base)
    asked: list[str] = []
    result = run_plan(drives_for(fake, base).hide_steps(), yes=False,
                      ask=lambda q: asked.append(q) or False, out=lambda line: None)
    assert result.declined and "wsl.conf" in asked[0] and "open to every user" in asked[0]
    assert not (base / "etc/wsl.conf").exists() and fake.calls == []


def test_a_busy_drive_is_detached_lazily_and_that_is_said(base):
    fake = FakeMounts(base, busy=True)
    lines: list[str] = []
    run_plan(drives_for(fake, base).hide_steps(), yes=True, ask=lambda q: False, out=lines.append)
    assert ["umount", "-l", str(fake.c)] in fake.calls and "detached lazily" in lines[1]


def test_a_drive_still_open_after_mounting_it_again_fails_the_step_naming_it_and_the_fix(base):
    fake = FakeMounts(base, mount_works=False)  # mount "succeeds" but changes nothing
    with pytest.raises(StepFailed) as e:
        run_plan(drives_for(fake, base).hide_steps(), yes=True, ask=lambda q: False, out=lambda line: None)
    assert str(fake.c) in str(e.value) and "still open" in str(e.value) and "wsl --shutdown" in str(e.value)


def test_an_owner_only_drive_is_already_done_and_the_opt_out_takes_only_our_masks_out(base):
    fake = FakeMounts(base, mode=0o700)
    fake.mountinfo.write_text(fake.mountinfo.read_text().replace("gid=1000", "gid=1000;umask=077"))
    drives = drives_for(fake, base)
    assert drives.hide_steps()[1].check().done
    conf = base / "etc/wsl.conf"
    conf.parent.mkdir()
    conf.write_text(wsl_conf_with_drive_masks(ADMIN_CONF))
    [undo] = drives.unhide_steps("--windows-drives open")
    assert not undo.check().done
    undo.apply()
    assert conf.read_text() == ADMIN_CONF and undo.check().done and fake.calls == []


def test_status_says_whether_the_drives_are_open_to_tenants(base):
    fake = FakeMounts(base)
    doc = {"installed": False, "install_command": "mtgpu-setup install --yes",
           "service": {"definition": "/etc/init.d/mtgpu"}, "node": {"answers": False, "error": "no socket"},
           "environment": {"venv": "/opt/mtgpu/venv", "version": None}, "config": {"path": "x", "valid": True},
           "windows_drives": drives_for(fake, base).status()}
    text = "\n".join(status_lines(doc))
    assert f"drives OPEN to every tenant: {fake.c}" in text and "leave the drives open" in text
    run_plan(drives_for(fake, base).hide_steps(), yes=True, ask=lambda q: False, out=lambda line: None)
    doc["windows_drives"] = drives_for(fake, base).status()
    text = "\n".join(status_lines(doc))
    assert f"hidden from tenants (owner-only): {fake.c}" in text and "owner-only [automount] options" in text


# ---------------------------------------------------------------- wired into install


def wsl_platform(wsl: bool = True) -> Platform:
    return Platform(systemd_running=False, wsl=wsl, pid1="init", has_update_rc_d=False)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="Installer.preflight refuses anyone but root")


@needs_root
def test_install_on_a_wsl_host_plans_the_drive_steps_before_the_service_and_off_wsl_says_there_are_none(tmp_path):
    from mtgpu.setup.install import InstallOptions, Installer

    def installer(wsl: bool, choice: str | None) -> Installer:
        i = Installer(InstallOptions(root=tmp_path, venv=Path(sys.prefix), packages=False, windows_drives=choice),
                      platform=wsl_platform(wsl))
        i.preflight()
        return i

    i = installer(True, None)
    titles = [s.title for s in i.steps()]
    [conf] = [n for n, t in enumerate(titles) if "Windows drives owner-only" in t]
    assert str(Layout.make(tmp_path).wsl_conf) in titles[conf]
    assert conf < next(n for n, t in enumerate(titles) if t.startswith("init script"))
    assert not any("mounted now" in t for t in titles)  # under --root the machine's own mounts are not the image's
    assert any("hidden from tenants" in line and "left as they are" in line for line in i.summary())
    opt_out = [s.title for s in installer(True, "open").steps()]
    assert not any("owner-only" in t for t in opt_out) and any("masks out of" in t for t in opt_out)
    off = installer(False, "hidden")
    assert not any("Windows" in s.title for s in off.steps())
    assert any("not a WSL2 host" in line for line in off.summary())
    assert not any("Windows" in line for line in installer(False, None).summary())
    with pytest.raises(SetupRefused, match="--windows-drives 'yes'"):
        installer(True, "yes")


@needs_root
def test_the_command_line_passes_the_flag_and_refuses_a_bad_value_before_any_change():
    from typer.testing import CliRunner

    from mtgpu.cli.setup import app

    r = CliRunner().invoke(app, ["install", "--windows-drives", "visible"])
    assert r.exit_code == 2 and "--windows-drives 'visible': give one of hidden, open" in r.output


@needs_root
def test_uninstall_keeps_the_masks_while_tenants_keep_accounts_and_purge_takes_them_out(tmp_path):
    from mtgpu.setup.uninstall import UninstallOptions, Uninstaller

    layout = Layout.make(tmp_path)
    layout.config.parent.mkdir(parents=True)
    layout.config.write_text(f'STATE_DIR = "{tmp_path / "state"}"\nTENANT_HOME_ROOT = "{tmp_path / "homes"}"\n'
                             'TENANT_UID_RANGE = [259990, 259999]\n')
    layout.wsl_conf.write_text(wsl_conf_with_drive_masks(ADMIN_CONF))

    def uninstaller(purge: bool) -> Uninstaller:
        u = Uninstaller(UninstallOptions(root=tmp_path, purge=purge), platform=wsl_platform(False))
        u.preflight()
        return u

    plain = uninstaller(False)
    assert not any("Windows-drive masks" in s.title for s in plain.steps())
    assert any("owner-only masks of the Windows drives" in k and "--purge" in k for k in plain.kept)
    purge = uninstaller(True)
    [undo] = [s for s in purge.steps() if "Windows-drive masks out of" in s.title]
    undo.apply()
    assert layout.wsl_conf.read_text() == ADMIN_CONF
