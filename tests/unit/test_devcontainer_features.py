"""Local Dev Container Features (issue 24, point 8): `"features": {"./my-feature": {...}}` read
from the project's folder as the specification says (options become variables, the user's
over the defaults), registry Features refused naming them; the image they make is built for
real in tests/integration/test_devcontainer_templates.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtgpu.workspaces import DevContainerError, load_devcontainer
from mtgpu.workspaces.features import feature_dockerfile, option_env_name, stage_feature_context

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "devcontainer"


def project(tmp_path: Path, features: dict, metas: dict[str, dict], **more) -> Path:
    dc = tmp_path / "p" / ".devcontainer"
    dc.mkdir(parents=True)
    (dc / "devcontainer.json").write_text(json.dumps({"image": "localhost/base:1", "features": features, **more}))
    for folder, meta in metas.items():
        (dc / folder).mkdir()
        (dc / folder / "devcontainer-feature.json").write_text(json.dumps(meta))
        (dc / folder / "install.sh").write_text("#!/bin/sh\n")
    return tmp_path / "p"


def load(path: Path):
    return load_devcontainer(path, home=str(path.parent), env={})


def problems(path: Path) -> dict[str, str]:
    with pytest.raises(DevContainerError) as info:
        load(path)
    return {p.key: p.message for p in info.value.problems}


@pytest.mark.parametrize(("option", "variable"), [("version", "VERSION"), ("installZsh", "INSTALLZSH"),
                                                  ("node-gyp", "NODE_GYP"), ("2fast", "_FAST"), ("a.b", "A_B")])
def test_option_names_become_variables_as_the_specification_writes_them(option, variable):
    assert option_env_name(option) == variable


def test_the_fixture_feature_reads_its_options_defaults_and_environment():
    d = load_devcontainer(FIXTURES / "local-feature", home=str(FIXTURES), env={})
    (f,) = d.features
    assert (f.id, f.ref.key) == ("hello", "./hello")
    assert dict(f.options_env) == {"GREETING": "hey", "SHOUT": "false"}
    assert dict(f.container_env) == {"HELLO_HOME": "/opt/hello"}
    assert d.cap_add == () and d.run_options() == ("--cap-add=SYS_PTRACE",)  # the Feature's own capAdd


def test_a_string_is_the_version_option_and_install_order_follows_installs_after(tmp_path):
    p = project(tmp_path, {"./b": "2.0", "./a": {}}, {
        "b": {"id": "b", "options": {"version": {"type": "string", "default": "1"}}, "installsAfter": ["a"]},
        "a": {"id": "a"}})
    d = load(p)
    assert [f.id for f in d.features] == ["a", "b"]
    assert dict(d.features[1].options_env) == {"VERSION": "2.0"}


def test_what_a_feature_cannot_do_here_is_named(tmp_path):
    assert "a folder under the folder of devcontainer.json" in problems(project(tmp_path / "o", {"../out": {}}, {}))[
        "features.../out"]
    p = project(tmp_path, {"./x": {"nosuch": "1"}, "./gone": {}}, {
        "x": {"id": "x", "privileged": True, "capAdd": ["SYS_ADMIN"], "mounts": ["source=/,target=/h,type=bind"],
              "dependsOn": {"ghcr.io/devcontainers/features/common-utils:2": {}}}})
    found = problems(p)
    assert set(found) == {"features../gone", "features../x.nosuch", "features../x.privileged",
                          "features../x.capAdd", "features../x.mounts", "features../x.dependsOn"}, found
    assert "no such folder" in found["features../gone"]
    assert "may add only SYS_PTRACE" in found["features../x.capAdd"]


def test_registry_and_url_features_are_refused_naming_each(tmp_path):
    p = project(tmp_path, {"ghcr.io/devcontainers/features/go:1": {}, "https://example.invalid/f.tgz": {}}, {})
    found = problems(p)
    assert "the Feature ghcr.io/devcontainers/features/go:1 comes from a registry" in found[
        "features.ghcr.io/devcontainers/features/go:1"]
    assert "comes from a URL" in found["features.https://example.invalid/f.tgz"]


def test_the_build_installs_each_feature_as_root_then_gives_the_image_its_user_back(tmp_path):
    d = load_devcontainer(FIXTURES / "local-feature", home=str(FIXTURES), env={})
    text = feature_dockerfile("localhost/base:1", d.features, "dev")
    assert text.splitlines() == [
        "FROM localhost/base:1", "USER root", "COPY 0-hello/ /tmp/mtgpu-features/0-hello/",
        "RUN cd /tmp/mtgpu-features/0-hello && chmod +x ./install.sh && set -a && . ./devcontainer-features.env "
        "&& set +a && ./install.sh && cd / && rm -rf /tmp/mtgpu-features/0-hello",
        'ENV HELLO_HOME="/opt/hello"', "USER dev"]
    stage_feature_context(d.features, str(tmp_path), remote_user="dev", container_user="root")
    env = (tmp_path / "0-hello" / "devcontainer-features.env").read_text().splitlines()
    assert env[:4] == ["GREETING=hey", "SHOUT=false", "_REMOTE_USER=dev", "_CONTAINER_USER=root"]
    assert (tmp_path / "0-hello" / "install.sh").exists()


def test_the_order_is_the_specifications_rounds_with_depends_on_as_the_reference_ran_it():
    """tests/fixtures/devcontainer/feature-order: its comment holds what @devcontainers/cli ran."""
    d = load_devcontainer(FIXTURES / "feature-order", home=str(FIXTURES), env={})
    assert [f.id for f in d.features] == ["delta", "gamma", "beta", "zeta", "alpha"]
    delta = d.features[0]
    assert delta.ref.key == "./delta" and dict(delta.options_env) == {"GREETING": "asked-by-zeta"}  # zeta's options
    assert [f.ref.key for f in d.features].count("./gamma") == 1  # beta's dependsOn is the gamma given


def test_features_without_dependencies_install_sorted_by_folder_not_as_written(tmp_path):
    p = project(tmp_path, {"./b": {}, "./a-x": {}, "./a_x": {}, "./A": {}}, {
        "b": {"id": "b"}, "a-x": {"id": "ax"}, "a_x": {"id": "a_x"}, "A": {"id": "big"}})
    assert [f.ref.key for f in load(p).features] == ["./A", "./a_x", "./a-x", "./b"]  # as Node's localeCompare


def test_a_depends_on_with_other_options_installs_the_feature_again(tmp_path):
    p = project(tmp_path, {"./a": {"v": "1"}, "./b": {}}, {
        "a": {"id": "a", "options": {"v": {"type": "string", "default": "0"}}},
        "b": {"id": "b", "dependsOn": {"./a": {"v": "2"}}}})
    order = [(f.id, dict(f.options_env)) for f in load(p).features]
    assert order == [("a", {"V": "1"}), ("a", {"V": "2"}), ("b", {})], order


def test_installs_after_a_feature_not_installed_is_no_dependency(tmp_path):
    p = project(tmp_path, {"./b": {}, "./a": {}}, {
        "b": {"id": "b", "installsAfter": ["ghcr.io/devcontainers/features/common-utils", "./gone"]},
        "a": {"id": "a", "installsAfter": ["./b"]}})
    assert [f.id for f in load(p).features] == ["b", "a"]


def test_a_cycle_is_refused_naming_the_features(tmp_path):
    p = project(tmp_path, {"./a": {}, "./b": {}, "./c": {}}, {
        "a": {"id": "a", "dependsOn": {"./b": {}}}, "b": {"id": "b", "installsAfter": ["./a"]}, "c": {"id": "c"}})
    found = problems(p)
    assert "the Features ./a, ./b wait for each other" in found["features"], found


def test_a_depends_on_from_a_registry_is_refused_naming_it(tmp_path):
    p = project(tmp_path, {"./x": {}}, {
        "x": {"id": "x", "dependsOn": {"./y": {}, "ghcr.io/devcontainers/features/common-utils:2": {}}},
        "y": {"id": "y"}})
    found = problems(p)
    assert set(found) == {"features../x.dependsOn"}, found
    assert ("the Feature x depends on ghcr.io/devcontainers/features/common-utils:2, from a registry, which this node "
            "cannot reach") in found["features../x.dependsOn"]
    assert 'name it "./common-utils" in this dependsOn' in found["features../x.dependsOn"]


def test_a_depends_on_outside_the_folder_of_devcontainer_json_is_refused(tmp_path):
    p = project(tmp_path, {"./x": {}}, {"x": {"id": "x", "dependsOn": {"../../elsewhere": {}}}})
    assert "a folder under the folder of devcontainer.json" in problems(p)["features../x.dependsOn.../../elsewhere"]
