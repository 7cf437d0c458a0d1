"""`${containerEnv:VAR}` (issue 24, point 7): the specification's own example,
`"remoteEnv": {"PATH": "${containerEnv:PATH}:/x"}`, reads the container's environment: the
image's Env (podman's default PATH when it sets none) and the container's own variables.
The reader leaves it for the member (which has the image), except where containerEnv
itself sets the variable; the member resolves the rest (variables.resolve_container_env,
run for real in tests/integration/test_devcontainer_templates.py)."""

from __future__ import annotations

import json

from mtgpu.workspaces import parse_devcontainer
from mtgpu.workspaces.variables import (PODMAN_DEFAULT_PATH, image_env, resolve_container_env,
                                        substitute_container_env)

IMAGE_ENV = {"PATH": "/usr/local/go/bin:/usr/bin:/bin", "GOPATH": "/go"}


def environment(config: dict) -> dict[str, str]:
    text = json.dumps({"image": "localhost/base:1", **config})
    return parse_devcontainer(text, config_path="/home/a/p/.devcontainer/devcontainer.json",
                              workspace_folder="/home/a/p", home="/home/a", env={}).environment()


def test_the_specifications_path_example_appends_to_the_images_path():
    env = resolve_container_env(environment({"remoteEnv": {"PATH": "${containerEnv:PATH}:/x"}}), IMAGE_ENV)
    assert env == {"PATH": "/usr/local/go/bin:/usr/bin:/bin:/x"}


def test_an_image_without_path_gets_podmans_default_path():
    assert resolve_container_env({"PATH": "${containerEnv:PATH}:/x"}, {}) == {"PATH": PODMAN_DEFAULT_PATH + ":/x"}


def test_unset_variables_take_their_default_else_nothing():
    env = {"A": "${containerEnv:NOPE:fallback}", "B": "[${containerEnv:NOPE}]", "C": "${containerEnv:GOPATH:x}/bin"}
    assert resolve_container_env(env, IMAGE_ENV) == {"A": "fallback", "B": "[]", "C": "/go/bin"}


def test_the_containers_own_variables_are_read_too():
    env = {"CUDA_VISIBLE_DEVICES": "0", "SEEN": "gpus=${containerEnv:CUDA_VISIBLE_DEVICES}"}
    assert resolve_container_env(env, IMAGE_ENV)["SEEN"] == "gpus=0"


def test_container_env_variables_are_resolved_by_the_reader_and_the_rest_left_for_the_member():
    env = environment({"containerEnv": {"TOOLS": "/opt/tools", "PATH": "/opt/tools/bin:/usr/bin"},
                       "remoteEnv": {"PATH": "${containerEnv:PATH}:/x", "T": "${containerEnv:TOOLS}/lib",
                                     "G": "${containerEnv:GOPATH}", "GONE": None}})
    assert env == {"TOOLS": "/opt/tools", "PATH": "/opt/tools/bin:/usr/bin:/x", "T": "/opt/tools/lib",
                   "G": "${containerEnv:GOPATH}"}
    assert resolve_container_env(env, IMAGE_ENV)["G"] == "/go"


def test_local_env_is_substituted_by_the_reader_as_before():
    text = json.dumps({"image": "x", "remoteEnv": {"P": "${localEnv:HOME}:${containerEnv:PATH}"}})
    d = parse_devcontainer(text, config_path="/home/a/p/.devcontainer.json", workspace_folder="/home/a/p",
                           home="/home/a", env={"HOME": "/home/a"})
    assert d.environment() == {"P": "/home/a:${containerEnv:PATH}"}


def test_substitution_without_a_variable_is_the_text_as_written():
    assert substitute_container_env("plain $PATH ${localEnv:X}", {"PATH": "p"}) == "plain $PATH ${localEnv:X}"


def test_an_images_env_list_becomes_a_mapping():
    assert image_env(["PATH=/a:/b", "EMPTY=", "EQ=a=b", "BAD"]) == {"PATH": "/a:/b", "EMPTY": "", "EQ": "a=b"}
    assert image_env(None) == {}
