"""`${containerEnv:...}` in lifecycle commands (issue 24): substituted as @devcontainers/cli
does where it knows the container (`devcontainer run-user-commands`, 0.89.0, run here against
the fixture's file: its comment holds what it printed), from the container's own environment,
the image's Env overlaid by containerEnv (remoteEnv is not the container's), in the string,
list and object forms of every hook. The reader resolves containerEnv's names
(DevContainer.lifecycle_commands), the member the image's (substitute_container_env_in_shell);
here both run, and the commands with /bin/sh, as the workspace's entry runs them."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from mtgpu.workspaces import load_devcontainer, parse_devcontainer
from mtgpu.workspaces.variables import container_env_of_image, substitute_container_env_in_shell

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer" / "lifecycle-container-env"
IMAGE_ENV = {"IMGVAR": "img", "PATH": "/usr/local/bin:/usr/bin:/bin:/sbin"}
CREATE = ("onCreateCommand", "updateContentCommand", "postCreateCommand")
START = ("postStartCommand", "postAttachCommand")


def _run(commands: list[str], tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    for c in commands:
        subprocess.run(["/bin/sh", "-c", c.replace("/tmp/out", str(out))], check=True, timeout=30)
    return out.read_text().split("\n")[:-1]


def _member(commands: list[str], image_env: dict[str, str]) -> list[str]:
    known = container_env_of_image(image_env)
    return [substitute_container_env_in_shell(c, known) for c in commands]


def test_every_hook_and_form_reads_the_containers_environment_as_the_reference(tmp_path):
    d = load_devcontainer(FIXTURE, home=str(FIXTURE.parent), env={})
    commands = _member(d.lifecycle_commands(CREATE) + d.lifecycle_commands(START), IMAGE_ENV)
    assert _run(commands, tmp_path) == ["on=over/c1/dflt/d2//", "post=c1", "start=over",
                                        "attach=/usr/local/bin:/usr/bin:/bin:/sbin"]


def test_a_list_forms_word_stays_one_word_whatever_the_value_holds(tmp_path):
    text = ('{"image": "localhost/base:1", "containerEnv": {"Q": "it\'s a b"},'
            ' "postCreateCommand": ["sh", "-c", "printf \'%s|\' \\"$0\\" \\"$1\\" >> /tmp/out",'
            ' "${containerEnv:Q}", "${containerEnv:WEIRD}"]}')
    d = parse_devcontainer(text, config_path="/h/p/.devcontainer/devcontainer.json", workspace_folder="/h/p",
                           home="/h", env={})
    weird = f"x'; touch {tmp_path}/pwned; '\"$HOME\""
    _run(_member(d.lifecycle_commands(CREATE), {"WEIRD": weird}), tmp_path)
    assert (tmp_path / "out").read_text() == f"it's a b|{weird}|"
    assert not (tmp_path / "pwned").exists()


def test_the_reader_leaves_the_images_names_and_resolves_container_envs():
    d = load_devcontainer(FIXTURE, home=str(FIXTURE.parent), env={})
    create = d.lifecycle_commands(CREATE)
    assert create[0] == ("echo on=${containerEnv:IMGVAR}/c1/${containerEnv:RVAR:dflt}/${containerEnv:NOPE:d2}/"
                         "${containerEnv:NOPE2}/ >> /tmp/out").replace("${containerEnv:IMGVAR}", "over")
    assert create[1] == shlex.join(["sh", "-c", "echo post=c1 >> /tmp/out"])
    # the parsed hooks stay as written (what `devcontainer read-configuration` prints, compared for every fixture)
    assert d.lifecycle["postAttachCommand"][0].shell == "echo attach=${containerEnv:PATH} >> /tmp/out"


def test_an_image_without_path_gets_podmans_default_and_unknown_names_their_default():
    cmd = "echo ${containerEnv:PATH} ${containerEnv:NOPE:fallback} [${containerEnv:NOPE}]"
    assert _member([cmd], {}) == ["echo /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin fallback []"]


def test_quotes_in_the_users_own_shell_text_are_kept():
    cmd = """echo '${containerEnv:A}' "${containerEnv:A}" \\'${containerEnv:A}"'" """
    assert _member([cmd], {"A": "v'w"}) == ["""echo 'v'"'"'w' "v'w" \\'v'w"'" """]
