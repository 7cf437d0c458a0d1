"""The devcontainer.json reader: the fixtures in tests/fixtures/devcontainer (the same ones
the reference check reads), then each rule on small inline files. Inline files are
parsed without touching the disk: parse_devcontainer takes the paths it pretends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtgpu.model.units import parse_size
from mtgpu.workspaces import (
    AppPort,
    Build,
    Command,
    DevContainer,
    DevContainerError,
    Mount,
    Reservation,
    load_devcontainer,
    locate_devcontainer,
    parse_devcontainer,
)
from mtgpu.workspaces.jsonc import JsoncError, loads_jsonc

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer"
FIXTURE_ENV = {"HOME": str(FIXTURES), "MTGPU_FIXTURE_VAR": "v"}
GIB = 2**30

HOME = "/home/alice"
PROJECT = f"{HOME}/proj"


def load(name: str) -> DevContainer:
    """A fixture as mt-container would read it, with the fixtures folder as the home."""
    return load_devcontainer(FIXTURES / name, home=str(FIXTURES), env=FIXTURE_ENV)


def refusal(name: str) -> DevContainerError:
    with pytest.raises(DevContainerError) as info:
        load(name)
    return info.value


def parse(config: dict | str, *, env: dict | None = None, project: str = PROJECT) -> DevContainer:
    """An inline devcontainer.json of a project in alice's home (nothing is read from disk)."""
    text = config if isinstance(config, str) else json.dumps(config)
    return parse_devcontainer(
        text, config_path=f"{project}/.devcontainer/devcontainer.json", workspace_folder=project, home=HOME, env=env or {}
    )


def problems_of(config: dict | str, **kw) -> dict[str, str]:
    """{key: message} of every problem the reader finds."""
    with pytest.raises(DevContainerError) as info:
        parse(config, **kw)
    return {p.key: p.message for p in info.value.problems}


def image(**more) -> dict:
    return {"image": "localhost/base:1", **more}


# ---------------------------------------------------------------- the fixtures


def test_image_only_fixture_is_found_as_dot_devcontainer_json_in_the_project():
    d = load("image-only")
    assert d.config_path == str(FIXTURES / "image-only" / ".devcontainer.json")
    assert (d.name, d.image, d.build) == ("image only", "localhost/base:1", None)
    assert d.reservation == Reservation()


def test_build_paths_are_resolved_from_the_folder_of_devcontainer_json():
    d = load("build-dockerfile")
    project = FIXTURES / "build-dockerfile"
    assert d.image is None
    assert d.build == Build(
        dockerfile=str(project / ".devcontainer" / "Dockerfile"),
        context=str(project),
        args={"PYTHON_VERSION": "3.11", "PROJECT": "build-dockerfile"},
        target="dev",
    )
    assert (d.container_user, d.remote_user) == ("dev", "dev")


def test_legacy_top_level_dockerfile_is_read_as_build():
    d = load("build-legacy")
    folder = FIXTURES / "build-legacy" / ".devcontainer"
    assert d.build == Build(dockerfile=str(folder / "Containerfile"), context=str(folder))


def test_comments_and_trailing_commas_are_accepted_and_strings_keep_their_slashes():
    d = load("jsonc")
    assert d.container_env == {
        "URL": "http://example.invalid/path",
        "GLOB": "/* not a comment */",
        "QUOTE": 'say "hi" // still a string',
    }
    assert d.forward_ports == (8888, 6006)
    assert d.remote_user == "root"


def test_variables_are_substituted_as_the_reference_does():
    d = load("variables")
    project = str(FIXTURES / "variables")
    assert d.container_env == {
        "LOCAL": project,
        "LOCAL_BASE": "variables",
        "CONTAINER": "/workspaces/variables",
        "CONTAINER_BASE": "variables",
        "FROM_ENV": "v",
        "FROM_OLD_ENV": "v",
        "UNSET": "",
        "DEFAULTED": "fallback",
        "SET_WINS": "v",
        "TWICE": "v-v",
        "LATER": "${containerEnv:PATH}",  # resolved in the container, later
        "ID": "${devcontainerId}",
        "UNKNOWN": "${notAVariable}",
    }
    assert d.remote_env == {"PATH": "${containerEnv:PATH}:/workspaces/variables/bin", "DROPPED": None}
    assert d.remote_user == "dev"
    assert d.lifecycle["postCreateCommand"] == (Command(argv=("echo", "variables", "/workspaces/variables")),)


def test_default_workspace_folder_and_mount_are_the_references():
    d = load("image-only")
    project = str(FIXTURES / "image-only")
    assert d.local_workspace_folder == project
    assert d.workspace_folder == "/workspaces/image-only"
    assert d.workspace_mount == Mount("bind", "/workspaces/image-only", project)


def test_mounts_in_string_and_object_form_with_workspace_folder_and_mount_given():
    d = load("mounts")
    project = str(FIXTURES / "mounts")
    assert d.workspace_folder == "/work/mounts"
    assert d.workspace_mount == Mount("bind", "/work/mounts", project)
    assert d.mounts == (
        Mount("bind", "/data", f"{project}/data", read_only=True),
        Mount("volume", "/root/.cache/pip", "pip-cache"),
        Mount("tmpfs", "/scratch"),
        Mount("bind", "/datasets", str(FIXTURES / "datasets")),
        Mount("volume", "/models", "models"),
    )
    assert d.mounts[0].to_mount_arg() == f"type=bind,source={project}/data,target=/data,readonly"


def test_lifecycle_commands_in_string_list_and_object_form():
    d = load("lifecycle")
    assert d.lifecycle == {
        "initializeCommand": (Command(shell="echo on the node"),),
        "onCreateCommand": (Command(argv=("pip", "install", "-r", "requirements.txt")),),
        "updateContentCommand": (),
        "postCreateCommand": (
            Command(shell="pip install -e .", name="deps"),
            Command(argv=("pre-commit", "install"), name="hooks"),
        ),
        "postStartCommand": (Command(shell="jupyter lab --no-browser --port 8888 &"),),
        "postAttachCommand": (Command(shell="cat /etc/motd", name="banner"),),
    }


def test_host_requirements_become_the_reservation():
    d = load("host-requirements")
    assert d.host_requirements is not None
    assert d.host_requirements.storage_bytes == 100 * GIB
    assert d.host_requirements.gpu_cores == 1000
    assert d.reservation == Reservation(cpus=8.0, mem_bytes=32 * GIB, gpus=1, vram_bytes=16 * GIB)
    assert d.reservation.directives() == {"cpus": "8", "mem": str(32 * GIB), "gpus": "1", "vram": str(16 * GIB)}


def test_forward_ports_are_deduplicated_and_app_ports_published_on_loopback():
    d = load("ports")
    assert d.forward_ports == (8888, 6006, 5000)
    assert d.app_ports == (
        AppPort(3000, 3000),
        AppPort(8000, 8000),
        AppPort(9001, 9000),
        AppPort(7000, None, "udp"),
    )


def test_allowed_run_args_pass_through_as_written():
    d = load("run-args")
    project = str(FIXTURES / "run-args")
    assert d.run_args[:3] == ("--shm-size=8g", "--env", "A=1")
    assert f"{project}/data:/data:ro" in d.run_args
    assert (d.init, d.override_command) == (True, False)


def test_privileged_run_args_are_refused_each_by_name():
    e = refusal("refused-privileged")
    shown = {p.key: p.value for p in e.problems}
    assert shown == {
        "runArgs[0]": "--privileged",
        "runArgs[1]": "--device /dev/nvidia0",
        "runArgs[3]": "--gpus=all",
        "runArgs[4]": "--network=host",
        "runArgs[5]": "--cap-add=SYS_ADMIN",
        "runArgs[6]": "--pid=host",
        "runArgs[7]": "--ipc=host",
        "runArgs[8]": "--userns=host",
    }
    assert "hostRequirements" in {p.key: p.message for p in e.problems}["runArgs[3]"]


def test_host_mounts_outside_the_home_are_refused_naming_the_mount():
    e = refusal("refused-host-mount")
    messages = {p.key: p.message for p in e.problems}
    assert set(messages) == {"mounts[1]", "mounts[2]", "runArgs[0]"}
    assert "bind source /etc is outside your home" in messages["mounts[1]"]
    assert "(that is /" in messages["mounts[2]"]
    assert "/var/run/docker.sock" in messages["runArgs[0]"]
    assert str(e).startswith(str(FIXTURES / "refused-host-mount" / ".devcontainer" / "devcontainer.json"))


def test_registry_features_are_refused_each_by_name_with_the_local_way_to_the_same_result():
    problems = {p.key: p for p in refusal("refused-features").problems}
    assert set(problems) == {"features.ghcr.io/devcontainers/features/python:1",
                             "features.ghcr.io/devcontainers/features/node:1"}
    p = problems["features.ghcr.io/devcontainers/features/python:1"]
    assert p.value == "ghcr.io/devcontainers/features/python:1"
    assert "comes from a registry, which this node cannot reach" in p.message
    assert '.devcontainer/python, and name it "./python"' in p.message


def test_docker_compose_is_refused():
    (p,) = refusal("refused-compose").problems
    assert (p.key, p.message) == ("dockerComposeFile", "docker compose is not supported; use image or build")


# ---------------------------------------------------------------- finding the file


def test_dot_devcontainer_folder_wins_over_dot_devcontainer_json(tmp_path):
    (tmp_path / ".devcontainer").mkdir()
    (tmp_path / ".devcontainer" / "devcontainer.json").write_text("{}")
    (tmp_path / ".devcontainer.json").write_text("{}")
    assert locate_devcontainer(tmp_path) == (str(tmp_path / ".devcontainer" / "devcontainer.json"), str(tmp_path))


def test_a_named_config_under_dot_devcontainer_belongs_to_the_project_above(tmp_path):
    config = tmp_path / ".devcontainer" / "gpu" / "devcontainer.json"
    config.parent.mkdir(parents=True)
    config.write_text("{}")
    assert locate_devcontainer(config) == (str(config), str(tmp_path))
    other = tmp_path / "configs" / "dev.json"
    other.parent.mkdir()
    other.write_text("{}")
    assert locate_devcontainer(other) == (str(other), str(tmp_path / "configs"))


def test_a_folder_without_devcontainer_json_names_both_places_looked(tmp_path):
    with pytest.raises(DevContainerError) as info:
        locate_devcontainer(tmp_path)
    assert ".devcontainer/devcontainer.json" in str(info.value) and ".devcontainer.json" in str(info.value)


# ---------------------------------------------------------------- JSON with comments


def test_malformed_json_names_line_and_column():
    with pytest.raises(DevContainerError) as info:
        parse('{\n  "image": "x",,\n}')
    assert "line 2 column" in str(info.value)


def test_an_unclosed_block_comment_is_named():
    with pytest.raises(DevContainerError, match=r"line 2: a /\* comment is never closed"):
        parse('{"image": "x"\n/* oops\n}')


def test_the_file_must_hold_an_object():
    with pytest.raises(DevContainerError, match="one JSON object"):
        parse("[1, 2]")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values, st.sampled_from([None, 1]))
def test_plain_json_reads_the_same_through_the_comment_stripper(value, indent):
    assert loads_jsonc(json.dumps(value, indent=indent)) == value


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet='{}[],:"/*\\ \nab1', max_size=40))
def test_any_text_gives_a_value_or_a_jsonc_error(text):
    try:
        loads_jsonc(text)
    except JsoncError:
        pass


# ---------------------------------------------------------------- image and build


def test_image_and_build_together_are_refused():
    assert "image or build, not both" in problems_of(image(build={"dockerfile": "Dockerfile"}))["image"]


def test_neither_image_nor_build_is_refused_with_both_spellings():
    assert 'needs "image" or "build"' in problems_of({"name": "x"})["image"]


def test_a_build_outside_the_home_is_refused():
    msg = problems_of({"build": {"dockerfile": "Dockerfile", "context": "../../.."}})["build.context"]
    assert "outside your home /home/alice" in msg


def test_build_options_are_refused():
    assert "Dockerfile" in problems_of({"build": {"dockerfile": "D", "options": ["--network=host"]}})["build.options"]


def test_a_project_outside_the_home_is_refused():
    msg = problems_of(image(), project="/srv/shared/proj")["workspaceMount"]
    assert "/srv/shared/proj is outside your home /home/alice" in msg


# ---------------------------------------------------------------- variables


def test_local_env_without_a_name_is_refused_naming_the_key():
    assert "names no variable" in problems_of(image(containerEnv={"A": "${localEnv}"}))["containerEnv.A"]


def test_keys_are_never_substituted():
    d = parse(image(containerEnv={"${localEnv:X}": "${localEnv:X}"}), env={"X": "y"})
    assert d.container_env == {"${localEnv:X}": "y"}


def test_a_default_is_cut_at_its_first_colon_as_in_the_reference():
    assert parse(image(containerEnv={"A": "${localEnv:NOPE:a:b}"})).container_env == {"A": "a"}


def test_workspace_folder_must_end_up_absolute():
    assert "absolute path" in problems_of(image(workspaceFolder="${containerWorkspaceFolder}/x"))["workspaceFolder"]


# ---------------------------------------------------------------- mounts


@pytest.mark.parametrize(
    ("mount", "expected"),
    [
        ("type=bind,source=relative/dir,target=/d", "not an absolute path"),
        ("type=bind,target=/d", "needs a source"),
        ("type=volume,source=/home/alice/x,target=/d", "takes a name"),
        ("type=image,source=x,target=/d", "not supported"),
        ("type=bind,source=/home/alice/x", "has no target"),
        ("type=bind,source=/home/alice/x,target=rel", "not an absolute path in the container"),
        ("type=bind,source=/home/alice/x,target=/d,ro=maybe", "not a boolean"),
        ({"type": "bind", "source": "/home/alice/x", "target": "/d", "readonly": True}, "unknown key 'readonly'"),
        ({"source": "/home/alice/x", "target": "/d"}, "needs a type"),
        ("type=bind,source=/home/alicebob,target=/d", "outside your home"),
        (42, "a mount is a string"),
    ],
)
def test_bad_mounts_are_refused_naming_the_mount(mount, expected):
    assert expected in problems_of(image(mounts=["type=tmpfs,target=/ok", mount]))["mounts[1]"]


def test_mount_keys_have_their_docker_aliases():
    d = parse(image(mounts=["src=/home/alice/a,dst=/a,type=bind,ro=true,bind-propagation=rslave"]))
    assert d.mounts == (Mount("bind", "/a", "/home/alice/a", True, (("bind-propagation", "rslave"),)),)


def test_a_workspace_mount_outside_the_home_is_refused():
    msg = problems_of(image(workspaceMount="type=bind,source=/srv,target=/w"))["workspaceMount"]
    assert "outside your home" in msg


# ---------------------------------------------------------------- runArgs


@pytest.mark.parametrize(
    "args",
    [
        ["--shm-size", "16g"],
        ["-eFOO=1"],
        ["-l", "a=b", "--label=c=d"],
        ["-h", "box"],
        ["-w", "/src"],
        ["--security-opt", "no-new-privileges:true"],
        ["--init=true"],
        ["--tmpfs", "/run/x"],
        ["--add-host=db:127.0.0.1"],
        ["-v", "/home/alice/data:/data"],
        ["-v", "/anonymous"],
        ["--mount=type=volume,source=v,target=/v"],
        ["--env-file", "/home/alice/.env"],
        ["--net=none"],
        ["--cap-add=SYS_PTRACE", "--security-opt", "seccomp=unconfined"],
        ["--cap-add", "cap_sys_ptrace", "--security-opt=seccomp:unconfined"],
    ],
)
def test_harmless_run_args_are_accepted(args):
    assert parse(image(runArgs=args)).run_args == tuple(args)


@pytest.mark.parametrize(
    ("args", "shown", "expected"),
    [
        (["--privileged"], "--privileged", "unprivileged"),
        (["--device=/dev/kvm"], "--device=/dev/kvm", "host devices"),
        (["--gpus", "all"], "--gpus all", "hostRequirements"),
        (["--cap-add", "NET_ADMIN"], "--cap-add NET_ADMIN", "may add only SYS_PTRACE"),
        (["--cap-add=SYS_PTRACE,SYS_ADMIN"], "--cap-add=SYS_PTRACE,SYS_ADMIN", "capability SYS_ADMIN is refused"),
        (["--cap-add", "ALL"], "--cap-add ALL", "may add only SYS_PTRACE"),
        (["--security-opt", "apparmor=unconfined"], "--security-opt apparmor=unconfined", "seccomp=unconfined (for debuggers)"),
        (["--security-opt=label=disable"], "--security-opt=label=disable", "only no-new-privileges"),
        (["--net=host"], "--net=host", "the node chooses the network"),
        (["--network", "slirp4netns"], "--network slirp4netns", "the node chooses the network"),
        (["--ipc", "container:x"], "--ipc container:x", "own IPC namespace"),
        (["--userns=keep-id"], "--userns=keep-id", "maps your uid"),
        (["-u", "0"], "-u 0", "containerUser"),
        (["-v", "/:/host"], "-v /:/host", "outside your home"),
        (["--volume=~/x:/x"], "--volume=~/x:/x", "relative"),
        (["--mount", "type=bind,source=/etc,target=/e"], "--mount type=bind,source=/etc,target=/e", "outside your home"),
        (["--env-file=/etc/environment"], "--env-file=/etc/environment", "in your home"),
        (["--label", "mtgpu.job=7"], "--label mtgpu.job=7", "the node's"),
        (["--memory", "1g"], "--memory 1g", "hostRequirements"),
        (["-p", "80:80"], "-p 80:80", "forwardPorts"),
        (["--name", "x"], "--name x", "mt-container create --name"),
        (["-it"], "-it", "-it is not on the allow-list"),
        (["--frobnicate", "x"], "--frobnicate x", "not on the allow-list"),
        (["bash"], "bash", "options only"),
        (["--shm-size"], "--shm-size", "needs a value"),
        (["--init=yes"], "--init=yes", "takes no value"),
    ],
)
def test_refused_run_args_name_the_argument_and_the_fix(args, shown, expected):
    with pytest.raises(DevContainerError) as info:
        parse(image(runArgs=args))
    (p,) = info.value.problems
    assert (p.key, p.value) == ("runArgs[0]", shown)
    assert expected in p.message


def test_privileged_and_cap_add_or_security_opt_beyond_a_debuggers_are_refused():
    problems = problems_of(image(privileged=True, capAdd=["SYS_PTRACE", "SYS_ADMIN"],
                                 securityOpt=["seccomp=unconfined", "apparmor=unconfined"]))
    assert set(problems) == {"privileged", "capAdd[1]", "securityOpt[1]"}
    assert "may add only SYS_PTRACE" in problems["capAdd[1]"]
    assert problems_of(image(capAdd="SYS_PTRACE")) == {"capAdd": 'must be a list of strings, such as ["SYS_PTRACE"]'}


def test_a_debuggers_cap_add_and_security_opt_become_podman_options():
    d = parse(image(capAdd=["SYS_PTRACE"], securityOpt=["seccomp=unconfined"], runArgs=["--shm-size=1g"]))
    assert (d.cap_add, d.security_opt) == (("SYS_PTRACE",), ("seccomp=unconfined",))
    assert d.run_options() == ("--shm-size=1g", "--cap-add=SYS_PTRACE", "--security-opt=seccomp=unconfined")


# ---------------------------------------------------------------- hostRequirements


@pytest.mark.parametrize(
    ("gpu", "reservation"),
    [
        (True, Reservation(gpus=1)),
        (False, Reservation()),
        ("optional", Reservation(gpu_optional=True)),
        ({"memory": "24gb"}, Reservation(gpus=1, vram_bytes=24 * GIB)),
        ({"cores": 2}, Reservation(gpus=1)),
    ],
)
def test_gpu_requirement_forms(gpu, reservation):
    assert parse(image(hostRequirements={"gpu": gpu})).reservation == reservation


@pytest.mark.parametrize(
    ("memory", "n_bytes"),
    [
        ("8gb", 8 * GIB),  # the spec's form, 1024-based as in the reference
        ("8GB", 8 * GIB),
        ("512mb", 512 * 2**20),
        ("1tb", 2**40),
        ("4096", 4096),
        ("8G", parse_size("8G")),  # other spellings: mtgpu's own sizes
        ("1.5GiB", parse_size("1.5GiB")),
    ],
)
def test_memory_sizes(memory, n_bytes):
    assert parse(image(hostRequirements={"memory": memory})).reservation.mem_bytes == n_bytes


def test_bad_host_requirements_are_all_named():
    problems = problems_of(image(hostRequirements={"cpus": 0, "memory": "lots", "gpu": {"cores": -1, "memory": "x"}}))
    assert set(problems) == {
        "hostRequirements.cpus",
        "hostRequirements.memory",
        "hostRequirements.gpu.cores",
        "hostRequirements.gpu.memory",
    }
    assert "8gb" in problems["hostRequirements.memory"]


def test_a_gpu_of_another_kind_is_refused():
    assert '"optional"' in problems_of(image(hostRequirements={"gpu": "yes"}))["hostRequirements.gpu"]


# ---------------------------------------------------------------- ports, env, commands


@pytest.mark.parametrize(
    ("ports", "key", "expected"),
    [
        (["db:5432"], "forwardPorts[0]", "write 5432"),
        ([0], "forwardPorts[0]", "1 to 65535"),
        ([True], "forwardPorts[0]", "1 to 65535"),
        ("8888", "forwardPorts", "must be a list"),
    ],
)
def test_bad_forward_ports(ports, key, expected):
    assert expected in problems_of(image(forwardPorts=ports))[key]


def test_app_ports_bound_to_another_address_are_refused():
    assert "loopback only" in problems_of(image(appPort="0.0.0.0:80:80"))["appPort"]
    assert parse(image(appPort=8080)).app_ports == (AppPort(8080, 8080),)


def test_environment_values_must_be_strings():
    problems = problems_of(image(containerEnv={"N": 1, "": "x"}, remoteEnv={"U": None, "B": False}))
    assert set(problems) == {"containerEnv.N", "containerEnv.", "remoteEnv.B"}


def test_bad_commands_name_the_hook():
    problems = problems_of(image(postCreateCommand=["ok", 1], postStartCommand={"a": {"b": "c"}}, onCreateCommand=7))
    assert set(problems) == {"postCreateCommand", "postStartCommand.a", "onCreateCommand"}


def test_every_problem_is_reported_at_once():
    with pytest.raises(DevContainerError) as info:
        parse({"build": 3, "features": {"ghcr.io/x/y:1": {}}, "runArgs": ["--privileged"], "remoteUser": 0})
    assert len(info.value.problems) == 4
    assert str(info.value).splitlines()[0] == f"{PROJECT}/.devcontainer/devcontainer.json: 4 problems:"
    assert isinstance(info.value, ValueError)


def test_keys_not_acted_on_are_listed():
    d = parse(image(customizations={"vscode": {}}, shutdownAction="none", build=None))
    assert d.ignored_keys == ("customizations", "shutdownAction")


def test_fixtures_cover_every_case_named_in_the_issue():
    names = set(os.listdir(FIXTURES))
    assert {"image-only", "build-dockerfile", "jsonc", "variables", "mounts", "lifecycle", "host-requirements",
            "ports", "refused-privileged", "refused-host-mount", "refused-features", "refused-compose"} <= names
