"""mtgpu-setup's pure parts and its files: the systemd unit (checked by the real
`systemd-analyze verify`), the init script, the service choice, boot hooks, the plan
runner, the config and secret decisions. Nothing here touches the machine's own /."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from mtgpu.config import load_config
from mtgpu.setup.configfile import (DEFAULT_SIMULATED_GPUS, parse_set, plan_config, render_config, settings_from_flags,
                                    validated)
from mtgpu.setup.environment import Environment, base_interpreter, missing_packages, package_list
from mtgpu.setup.install import flags_from
from mtgpu.setup.layout import Layout
from mtgpu.setup.node import role_of
from mtgpu.setup.plan import Check, SetupRefused, Step, StepFailed, run_plan
from mtgpu.setup.secret import plan_secret
from mtgpu.setup.service import (WANTS_LINK, InitdService, Platform, RcLinks, SystemdImageService, SystemdService,
                                 UpdateRcD, choose_service, init_script, make_service, systemd_unit,
                                 wsl_conf_with_boot, wsl_conf_without_boot)
from mtgpu.config import config_from_dict

REPO = Path(__file__).resolve().parents[2]
# An existing executable: systemd-analyze verify refuses an ExecStart that is missing.
SERVER = Path("/opt/mtgpu/venv/bin/mtgpu-server")


def make_platform(systemd=False, wsl=False, pid1="init", update_rc_d=True) -> Platform:
    return Platform(systemd_running=systemd, wsl=wsl, pid1=pid1, has_update_rc_d=update_rc_d)


def verify(unit: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)


needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")


# ---------------------------------------------------------------- the systemd unit


@needs_analyze
@pytest.mark.skipif(not SERVER.exists(), reason=f"{SERVER} (the unit's ExecStart) is not installed")
def test_the_generated_unit_passes_systemd_analyze_verify_with_nothing_on_stderr(tmp_path):
    unit = tmp_path / "mtgpu.service"
    unit.write_text(systemd_unit(SERVER, tmp_path / "mtgpu.toml"))
    r = verify(unit)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"systemd-analyze verify warned about the unit:\n{r.stderr}"


@needs_analyze
@pytest.mark.skipif(not SERVER.exists(), reason=f"{SERVER} is not installed")
def test_verify_would_catch_an_unknown_key_so_the_empty_stderr_check_means_something(tmp_path):
    unit = tmp_path / "mtgpu.service"
    unit.write_text(systemd_unit(SERVER, tmp_path / "mtgpu.toml").replace("KillMode=process", "KillMode=process\nKilMode=x"))
    r = verify(unit)
    assert "KilMode" in r.stderr


def test_the_unit_restarts_on_failure_and_leaves_jobs_alone_on_stop():
    text = systemd_unit(SERVER, Path("/etc/mtgpu/mtgpu.toml"))
    assert f"ExecStart={SERVER} --config /etc/mtgpu/mtgpu.toml\n" in text
    assert "Restart=on-failure\n" in text
    assert "KillMode=process\n" in text  # a stop signals mtgpu-server alone: job supervisors outlive it
    assert "WantedBy=multi-user.target\n" in text


def test_the_systemd_service_drives_systemctl(tmp_path):
    calls = []

    def run(cmd, **kw):
        calls.append(cmd)
        out = "4242\n" if cmd[1] == "show" else ""
        return subprocess.CompletedProcess(cmd, 0, out, "")

    svc = SystemdService(Layout.make(tmp_path, venv=Path("/opt/mtgpu/venv")), run)
    svc.install_definition()
    assert (tmp_path / "etc/systemd/system/mtgpu.service").read_text() == svc.definition_text()
    svc.enable_autostart()
    svc.start()
    assert svc.running_pid() == 4242
    assert ["systemctl", "daemon-reload"] in calls
    assert ["systemctl", "enable", "mtgpu.service"] in calls
    assert ["systemctl", "start", "mtgpu.service"] in calls


# ---------------------------------------------------------------- which service path


def test_systemd_as_pid_1_gets_the_unit():
    choice = choose_service(make_platform(systemd=True, pid1="systemd"), "auto", prefixed=False)
    assert (choice.kind, choice.boot_hook) == ("systemd", "systemctl enable")


def test_without_systemd_the_init_script_is_started_at_boot_by_update_rc_d():
    choice = choose_service(make_platform(pid1="init"), "auto", prefixed=False)
    assert (choice.kind, choice.boot_hook) == ("init.d", "update-rc.d")
    assert "systemd is not PID 1" in choice.why and not choice.caveat


def test_a_pid_1_that_runs_no_boot_scripts_is_said():
    choice = choose_service(make_platform(pid1="process_api"), "auto", prefixed=False)
    assert choice.kind == "init.d" and "process_api" in choice.caveat


def test_wsl2_without_systemd_uses_the_boot_command_of_wsl_conf():
    choice = choose_service(make_platform(wsl=True, pid1="init"), "auto", prefixed=False)
    assert (choice.kind, choice.boot_hook) == ("init.d", "wsl.conf")
    assert "WSL2" in choice.why and "/etc/wsl.conf" in choice.why


def test_wsl2_with_systemd_gets_the_unit():
    choice = choose_service(make_platform(systemd=True, wsl=True, pid1="systemd"), "auto", prefixed=False)
    assert choice.kind == "systemd"


def test_an_install_under_a_root_folder_makes_its_own_rc_links():
    choice = choose_service(make_platform(systemd=True), "auto", prefixed=True)
    assert (choice.kind, choice.boot_hook) == ("init.d", "rc links")


def test_asking_for_systemd_where_it_does_not_run_is_refused_with_the_fix():
    with pytest.raises(SetupRefused, match="systemd is not running here.*--service.*--root DIR to write the unit"):
        choose_service(make_platform(pid1="process_api"), "systemd", prefixed=False)
    with pytest.raises(SetupRefused, match="--service 'upstart'"):
        choose_service(make_platform(), "upstart", prefixed=False)


def test_systemd_under_a_root_folder_is_a_unit_written_and_enabled_for_an_image_not_started(tmp_path):
    for platform in (make_platform(pid1="process_api"), make_platform(systemd=True, pid1="systemd")):
        choice = choose_service(platform, "systemd", prefixed=True)
        assert (choice.kind, choice.boot_hook) == ("systemd", WANTS_LINK) and "not started here" in choice.why
    layout = Layout.make(tmp_path, venv=tmp_path / "venv")
    svc = make_service(choice, layout, run=lambda *a, **k: pytest.fail(f"no command may run: {a}"))
    assert isinstance(svc, SystemdImageService) and not svc.startable and svc.running_pid() is None
    svc.install_definition()
    assert (tmp_path / "etc/systemd/system/mtgpu.service").read_text() == svc.definition_text()
    assert not svc.autostart_enabled()
    svc.enable_autostart()
    link = tmp_path / "etc/systemd/system/multi-user.target.wants/mtgpu.service"
    assert os.readlink(link) == "/etc/systemd/system/mtgpu.service" and svc.autostart_enabled()
    with pytest.raises(StepFailed, match="its systemd starts it"):
        svc.start()
    svc.disable_autostart()
    svc.remove_definition()
    assert not link.is_symlink() and not svc.definition.exists()


# ---------------------------------------------------------------- boot hooks


def test_wsl_conf_gets_a_boot_section_and_keeps_the_rest():
    text = "[automount]\nenabled = true\n"
    out = wsl_conf_with_boot(text, "/etc/init.d/mtgpu start")
    assert out == "[automount]\nenabled = true\n\n[boot]\ncommand = /etc/init.d/mtgpu start\n"
    assert wsl_conf_with_boot(out, "/etc/init.d/mtgpu start") == out  # idempotent
    assert wsl_conf_without_boot(out, "/etc/init.d/mtgpu start") == "[automount]\nenabled = true\n\n[boot]\n"


def test_wsl_conf_keeps_an_existing_boot_command_and_adds_ours_after_it():
    text = "[boot]\ncommand = service cron start\n[network]\nhostname = x\n"
    out = wsl_conf_with_boot(text, "/etc/init.d/mtgpu start")
    assert "command = service cron start; /etc/init.d/mtgpu start\n" in out and "[network]\nhostname = x" in out
    assert wsl_conf_without_boot(out, "/etc/init.d/mtgpu start") == text


def test_wsl_conf_with_an_empty_boot_section_gets_the_command_inside_it():
    out = wsl_conf_with_boot("[boot]\n[user]\ndefault = me\n", "/etc/init.d/mtgpu start")
    assert out == "[boot]\ncommand = /etc/init.d/mtgpu start\n[user]\ndefault = me\n"


def test_rc_links_point_at_the_init_script_and_go_again(tmp_path):
    links = RcLinks(Layout.make(tmp_path))
    assert not links.enabled()
    links.enable()
    assert links.enabled()
    assert os.readlink(tmp_path / "etc/rc2.d/S20mtgpu") == "../init.d/mtgpu"
    assert os.readlink(tmp_path / "etc/rc0.d/K01mtgpu") == "../init.d/mtgpu"
    links.disable()
    assert not links.enabled() and not (tmp_path / "etc/rc3.d/S20mtgpu").is_symlink()


def test_update_rc_d_is_called_with_defaults_and_remove(tmp_path):
    calls = []
    hook = UpdateRcD(Layout.make(tmp_path), lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", ""))
    hook.enable()
    hook.disable()
    assert calls == [["update-rc.d", "mtgpu", "defaults"], ["update-rc.d", "-f", "mtgpu", "remove"]]


def test_update_rc_d_counts_as_enabled_only_with_its_start_link(tmp_path):
    layout = Layout.make(tmp_path)
    hook = UpdateRcD(layout, lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "", ""))
    for lv in "2345":
        layout.rc_dir(lv).mkdir(parents=True)
    (layout.rc_dir("2") / "S01ssh").symlink_to("../init.d/ssh")  # another service's link
    assert not hook.enabled()
    (layout.rc_dir("2") / "S01mtgpu").symlink_to("../init.d/mtgpu")
    assert hook.enabled()


# ---------------------------------------------------------------- the init script


def _script(tmp_path) -> InitdService:
    layout = Layout.make(tmp_path, venv=tmp_path / "venv")
    svc = InitdService(layout, RcLinks(layout))
    svc.install_definition()
    return svc


def test_the_init_script_is_valid_sh_with_an_lsb_header(tmp_path):
    svc = _script(tmp_path)
    assert subprocess.run(["sh", "-n", str(svc.definition)]).returncode == 0
    text = svc.definition.read_text()
    assert "### BEGIN INIT INFO" in text and "# Provides:          mtgpu" in text
    assert "Default-Start:     2 3 4 5" in text
    assert os.stat(svc.definition).st_mode & 0o111


def test_the_init_script_status_follows_lsb_and_a_stale_pidfile_is_not_running(tmp_path):
    svc = _script(tmp_path)
    run = lambda action: subprocess.run(["sh", str(svc.definition), action], capture_output=True, text=True)  # noqa: E731
    assert run("status").returncode == 3
    svc.layout.pidfile.parent.mkdir(parents=True, exist_ok=True)
    svc.layout.pidfile.write_text(f"{os.getpid()}\n")  # a live pid that is not the server
    assert run("status").returncode == 1
    assert svc.running_pid() is None
    r = run("stop")
    assert r.returncode == 0 and "not running" in r.stdout
    assert run("bogus").returncode == 2


def test_the_init_script_refuses_to_start_without_the_server(tmp_path):
    r = subprocess.run(["sh", str(_script(tmp_path).definition), "start"], capture_output=True, text=True)
    assert r.returncode == 5 and "mtgpu-setup install" in r.stderr


def test_the_init_script_start_waits_for_the_node_to_answer_and_says_when_it_does_not(tmp_path):
    svc = _script(tmp_path)
    bin_dir = svc.layout.server.parent
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the environment's python
    (bin_dir / "python").chmod(0o755)
    svc.layout.server.write_text("#!/bin/sh\nsleep 60\n")  # runs, never answers
    svc.layout.server.chmod(0o755)
    svc.layout.config.parent.mkdir(parents=True)
    svc.layout.config.write_text(f'STATE_DIR = "{tmp_path / "state"}"\n')
    env = {**os.environ, "MTGPU_START_TIMEOUT": "1"}
    try:
        r = subprocess.run(["sh", str(svc.definition), "start"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0 and "not answering yet" in r.stdout, r.stdout + r.stderr
        assert f"did not answer on {tmp_path / 'state' / 'mtgpu.sock'} within 1s" in r.stderr, r.stderr
    finally:
        subprocess.run(["sh", str(svc.definition), "stop"], capture_output=True, timeout=60)


def test_init_script_paths_are_quoted():
    text = init_script(Path("/opt/a+b/bin/mtgpu-server"), Path("/etc/mtgpu/x.toml"), Path("/run/mtgpu.pid"),
                       Path("/var/log/mtgpu/server.log"))
    assert "DAEMON=/opt/a+b/bin/mtgpu-server\n" in text


# ---------------------------------------------------------------- the plan runner


def make_steps(log: list[str], done: set[str]) -> list[Step]:
    def step(name: str) -> Step:
        def apply() -> str:
            done.add(name)
            log.append(name)
            return f"did {name}"

        return Step(name, lambda: Check(name in done, "there"), apply)

    return [step("a"), step("b"), step("c")]


def test_yes_applies_every_step_and_a_rerun_changes_nothing_and_says_so():
    log, done, lines = [], set(), []
    result = run_plan(make_steps(log, done), yes=True, ask=lambda q: pytest.fail("asked"), out=lines.append)
    assert log == ["a", "b", "c"] and result.changed
    lines.clear()
    again = run_plan(make_steps(log, done), yes=True, ask=lambda q: pytest.fail("asked"), out=lines.append)
    assert not again.changed and log == ["a", "b", "c"]
    assert lines[-1] == "nothing changed: every step was already done"
    assert all("already done" in line for line in lines[:-1])


def test_without_yes_each_change_is_asked_and_a_no_stops_there():
    log, done, lines, asked = [], {"a"}, [], []

    def ask(question: str) -> bool:
        asked.append(question)
        return "b" not in question.split(":")[0]

    result = run_plan(make_steps(log, done), yes=False, ask=ask, out=lines.append)
    assert len(asked) == 1 and "b" in asked[0]  # a was done: not asked
    assert result.declined == "b" and log == []
    assert "you said no" in lines[-1]


def test_a_step_that_changes_nothing_is_not_asked_about():
    calls = []
    steps = [Step("wait", lambda: Check(False), lambda: calls.append(1) or "waited", change=False)]
    run_plan(steps, yes=False, ask=lambda q: pytest.fail("asked"), out=lambda line: None)
    assert calls == [1]


def test_a_failed_step_says_which():
    def boom() -> str:
        raise StepFailed("the disk is full")

    with pytest.raises(StepFailed, match=r"\[1/1\] write: the disk is full"):
        run_plan([Step("write", lambda: Check(False), boom)], yes=True, ask=lambda q: True, out=lambda line: None)


# ---------------------------------------------------------------- packages: one list


def test_the_package_list_is_one_file_read_by_install_sh_too():
    node = package_list(("node",))
    assert "podman" in node and "openssh-server" in node and "busybox-static" not in node
    assert "busybox-static" in package_list(("node", "test"))
    script = (REPO / "scripts/install.sh").read_text()
    assert "mtgpu/setup/packages.txt" in script and "uidmap" not in script
    r = subprocess.run(["bash", "-c", 'roles="node"; PACKAGES=(); while read -r role name _; do '
                        'case "$role" in \'\'|\\#*) continue ;; esac; case " $roles " in *" $role "*) '
                        'PACKAGES+=("$name") ;; esac; done < mtgpu/setup/packages.txt; echo "${PACKAGES[@]}"'],
                       cwd=REPO, capture_output=True, text=True)
    assert r.stdout.split() == node
    assert 'while read -r role name _; do' in script


@pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a dpkg system")
def test_missing_packages_are_the_ones_dpkg_does_not_show_installed():
    out = "tmux install ok installed\npodman deinstall ok config-files\n"
    run = lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, out, "no packages found matching gcc")  # noqa: E731
    assert missing_packages(["tmux", "podman", "gcc"], run) == ["podman", "gcc"]


def test_a_malformed_package_line_is_named():
    with pytest.raises(ValueError, match="ROLE PACKAGE WHY"):
        package_list(("node",), text="nodes podman\n")


# ---------------------------------------------------------------- the environment's interpreter


@pytest.fixture()
def open_folder():
    """A folder others may enter (pytest's tmp_path lies under a 0700 one), removed after."""
    d = Path(tempfile.mkdtemp(prefix="mtgpu-interp-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def fake_python(at: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.write_text("#!/bin/sh\nexit 0\n")
    at.chmod(0o755)
    return at


def test_the_environment_is_made_with_the_system_python3_not_the_first_on_roots_path(open_folder):
    pyenv = fake_python(open_folder / "root/.pyenv/shims/python3")
    system = fake_python(open_folder / "usr/bin/python3")
    assert base_interpreter(system, which=lambda name: str(pyenv)) == system
    assert base_interpreter(open_folder / "none/python3", which=lambda name: str(pyenv)) == pyenv
    calls = []
    run = lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0, "", "")  # noqa: E731
    Environment(open_folder / "venv", "1.0", REPO, run, python=system).apply()
    assert calls[0] == [str(system), "-m", "venv", str(open_folder / "venv")]


def test_an_interpreter_tenants_cannot_reach_is_refused_naming_it_the_folder_and_the_fix(open_folder):
    home = open_folder / "root"
    pyenv = fake_python(home / ".pyenv/versions/3.12.1/bin/python3")
    home.chmod(0o700)  # root's home, as pyenv leaves it
    env = Environment(open_folder / "opt/venv", "1.0", REPO, python=pyenv)
    with pytest.raises(SetupRefused) as e:
        env.preflight()
    text = str(e.value)
    assert f"interpreter {pyenv}: {home} stops them (mode 0700" in text
    assert "bad interpreter: Permission denied" in text and "/usr/bin/python3" in text
    assert f"chmod o+x {home}" in text
    home.chmod(0o755)
    env.preflight()  # reachable now: nothing to say
    # An existing environment whose interpreter is a link into such a folder is refused the same way.
    venv = open_folder / "opt/venv2"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(pyenv)
    pyenv.chmod(0o750)
    with pytest.raises(SetupRefused, match=rf"{venv}/bin/python \(that is {pyenv}\): {pyenv} stops them \(mode 0750"
                       rf".*remove {venv} and run again.*chmod o\+rx {pyenv}"):
        Environment(venv, "1.0", REPO, run=lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "")).preflight()


# ---------------------------------------------------------------- the config from flags


def test_flags_become_config_keys_and_cluster_id_means_cluster_mode():
    flags = flags_from(cluster_id="lab-a", peers="10.0.0.1:7070, 10.0.0.2:7070", listen="10.0.0.3:7070")
    settings = settings_from_flags(flags, [parse_set("TENANT_UID_RANGE=[420000, 429999]"),
                                           parse_set("GPU_BACKEND=simulated"), parse_set("CONTAINERS.enabled=true")])
    assert settings == {"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab-a", "PEERS": ["10.0.0.1:7070", "10.0.0.2:7070"],
                        "LISTEN": "10.0.0.3:7070", "TENANT_UID_RANGE": [420000, 429999], "GPU_BACKEND": "simulated",
                        "CONTAINERS": {"enabled": True}, "SIMULATED_GPUS": [DEFAULT_SIMULATED_GPUS]}


def test_simulated_gpus_given_are_kept_and_without_them_two_default_ones_are_written():
    mine = parse_set('SIMULATED_GPUS=[{model = "T4", vendor = "nvidia", vram = "16GiB", count = 1}]')
    settings = settings_from_flags(flags_from(gpu_backend="simulated"), [mine])
    assert settings["SIMULATED_GPUS"] == [{"model": "T4", "vendor": "nvidia", "vram": "16GiB", "count": 1}]
    assert "SIMULATED_GPUS" not in settings_from_flags(flags_from(gpu_backend="nvml"), [])
    cfg = validated(settings_from_flags(flags_from(gpu_backend="simulated"), []), "flags")
    assert [(g.model, g.count) for g in cfg.SIMULATED_GPUS] == [("NVIDIA GeForce RTX 4090", 2)]


def test_the_written_config_reads_back_as_the_same_config(tmp_path):
    settings = settings_from_flags(flags_from(cluster_id="lab-a", listen="127.0.0.1:7070"),
                                   [parse_set("TENANT_UID_RANGE=[420000, 429999]"), parse_set("CONTAINERS.enabled=true")])
    path = tmp_path / "mtgpu.toml"
    path.write_text(render_config(settings))
    c = load_config(path)
    assert c.CLUSTER_ID == "lab-a" and c.TENANT_UID_RANGE == (420000, 429999) and c.CONTAINERS.enabled


def test_bad_flags_are_refused_naming_the_key_the_value_and_the_fix(tmp_path):
    with pytest.raises(SetupRefused, match="--peers needs --cluster-id"):
        settings_from_flags(flags_from(peers="10.0.0.1:7070"), [])
    with pytest.raises(SetupRefused, match="'LISTN' is not a config key"):
        parse_set("LISTN=1")
    with pytest.raises(SetupRefused, match="give KEY=VALUE"):
        parse_set("LISTEN")
    settings = settings_from_flags(flags_from(listen="nowhere"), [])
    with pytest.raises(SetupRefused, match='LISTEN = "nowhere": must be host:port'):
        plan_config(tmp_path / "mtgpu.toml", settings, {"LISTEN"})
    assert not (tmp_path / "mtgpu.toml").exists()


def test_an_existing_config_is_kept_and_a_flag_that_differs_is_noted(tmp_path):
    path = tmp_path / "mtgpu.toml"
    path.write_text('NODE_NAME = "old"\n')
    plan = plan_config(path, {"NODE_NAME": "new"}, {"NODE_NAME"})
    assert plan.check().done and plan.config.NODE_NAME == "old"
    assert len(plan.notes) == 1 and '"new"' in plan.notes[0] and '"old"' in plan.notes[0]


def test_an_invalid_existing_config_is_refused_with_the_key_and_the_fix(tmp_path):
    path = tmp_path / "mtgpu.toml"
    path.write_text('GPU_BACKEND = "cuda"\n')
    with pytest.raises(SetupRefused) as e:
        plan_config(path, {}, set())
    assert 'GPU_BACKEND = "cuda"' in str(e.value) and "kept as it is" in str(e.value)
    assert path.read_text() == 'GPU_BACKEND = "cuda"\n'


# ---------------------------------------------------------------- the cluster secret


def cluster(tmp_path, **keys):
    return config_from_dict({"CLUSTER_MODE": "cluster", "CLUSTER_ID": "lab", "STATE_DIR": str(tmp_path),
                             "LISTEN": "10.0.0.1:7070", **keys})


def test_a_standalone_node_needs_no_secret(tmp_path):
    assert plan_secret(config_from_dict({"STATE_DIR": str(tmp_path)}), False, None) is None


def test_the_first_member_creates_the_secret_mode_0600(tmp_path):
    plan = plan_secret(cluster(tmp_path), False, None)
    assert plan.action == "create"
    plan.apply()
    secret = tmp_path / "cluster.secret"
    assert len(secret.read_text().strip()) >= 32 and (os.stat(secret).st_mode & 0o777) == 0o600
    assert plan.check().done


def test_peers_naming_only_this_node_is_a_first_member(tmp_path):
    assert plan_secret(cluster(tmp_path, PEERS=["10.0.0.1:7070"]), False, None).action == "create"


def test_a_joiner_without_the_secret_is_refused_with_the_fix(tmp_path):
    with pytest.raises(SetupRefused) as e:
        plan_secret(cluster(tmp_path, PEERS=["10.0.0.2:7070"]), False, None)
    message = str(e.value)
    assert str(tmp_path / "cluster.secret") in message and "--secret-file" in message and "--first" in message
    assert "copy that file from the first member" in message
    assert plan_secret(cluster(tmp_path, PEERS=["10.0.0.2:7070"]), True, None).action == "create"


def test_a_joiner_given_the_secret_file_gets_a_copy(tmp_path):
    given = tmp_path / "from-first"
    given.write_text("s" * 40 + "\n")
    (tmp_path / "state").mkdir()
    plan = plan_secret(cluster(tmp_path / "state", PEERS=["10.0.0.2:7070"]), False, given)
    assert plan.action == "copy"
    plan.apply()
    assert (tmp_path / "state/cluster.secret").read_text() == "s" * 40 + "\n"


def test_a_short_or_different_secret_file_is_refused(tmp_path):
    short = tmp_path / "short"
    short.write_text("abc")
    with pytest.raises(SetupRefused, match="holds 3 characters.*at least 32"):
        plan_secret(cluster(tmp_path, PEERS=["10.0.0.2:7070"]), False, short)
    (tmp_path / "cluster.secret").write_text("a" * 40)
    other = tmp_path / "other"
    other.write_text("b" * 40)
    with pytest.raises(SetupRefused, match="already holds a different secret"):
        plan_secret(cluster(tmp_path, PEERS=["10.0.0.2:7070"]), False, other)


def test_secret_flags_on_a_standalone_config_are_refused(tmp_path):
    with pytest.raises(SetupRefused, match="--first is for cluster mode"):
        plan_secret(config_from_dict({"STATE_DIR": str(tmp_path)}), True, None)


# ---------------------------------------------------------------- the node's role


def test_the_role_comes_from_the_health_answer():
    assert role_of({"cluster_mode": "standalone", "raft": None}) == "standalone"
    assert role_of({"cluster_mode": "cluster", "raft": {"is_leader": True}}) == "leader"
    assert role_of({"cluster_mode": "cluster", "raft": {"is_leader": False, "voter": False}}) == "follower"


def test_the_start_wait_takes_a_process_for_ended_only_when_it_is_gone_or_a_zombie():
    """Not by its command line: that is empty for a moment while env, setsid and the
    interpreter exec one another, and a busy machine's start once said "did not start"."""
    from mtgpu.setup.answer import _alive

    child = subprocess.Popen(["sleep", "30"])
    try:
        assert _alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not _alive(child.pid)  # a zombie (not reaped yet) has ended
    finally:
        child.kill()
        child.wait()
    assert not _alive(child.pid)  # reaped: no such process
