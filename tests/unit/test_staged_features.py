"""Features from a registry or a URL that an admin staged (issue 24, point 8: "a Feature that
names a registry is refused naming it, unless its archive is staged"): `[CONTAINERS]
features` parsed, each archive checked (root's file, no absolute path, '..' or link out of
the folder, not damaged) and unpacked into a fresh folder, and devcontainer.json files that
mix local and staged Features, ordered as @devcontainers/cli orders registry Features. The
build itself is in tests/integration/test_devcontainer_templates.py."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from mtgpu.config import ConfigError, config_from_dict
from mtgpu.server.cluster.errors import ClusterSetupError
from mtgpu.server.main import container_settings
from mtgpu.workspaces import DevContainerError, load_devcontainer
from mtgpu.workspaces.feature_archive import FeatureArchiveError, check, read_staged, unpack
from mtgpu.workspaces.features import FeatureRef, StagedFolder, feature_key

NODE = "ghcr.io/devcontainers/features/node:1"
COMMON = "ghcr.io/devcontainers/features/common-utils:2"


def archive(files: dict[str, object], gz: bool = True) -> bytes:
    """A tar(.gz) of `files`: text, or a TarInfo to add as it is (links, devices). The same
    files give the same bytes (the gzip header's time is 0, not now): a Feature staged twice
    has one digest, as one archive on a node has (a run under load straddled a second)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in files.items():
            if isinstance(content, tarfile.TarInfo):
                tar.addfile(content)
                continue
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755 if name.endswith(".sh") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue(), mtime=0) if gz else buf.getvalue()


def feature(meta: dict, **more: object) -> bytes:
    return archive({"./devcontainer-feature.json": json.dumps(meta), "./install.sh": "#!/bin/sh\necho hi\n", **more})


def link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


# ---------------------------------------------------------------- the config


def test_features_are_named_as_devcontainer_json_names_them_one_spelling_each():
    c = config_from_dict({"CONTAINERS": {"features": {
        "ghcr.io/devcontainers/features/Node:1": "/srv/f/node-1.tgz", "ghcr.io/x/y/z": "/srv/f/z.tgz",
        "https://example.lab/f.tgz": "/srv/f/url.tgz"}}}).CONTAINERS
    assert {feature_key(k): v for k, v in c.features.items()} == {
        NODE: Path("/srv/f/node-1.tgz"), "ghcr.io/x/y/z:latest": Path("/srv/f/z.tgz"),
        "https://example.lab/f.tgz": Path("/srv/f/url.tgz")}
    assert feature_key("GHCR.io/devcontainers/features/node:1") == NODE == FeatureRef(NODE, "").staged_key


@pytest.mark.parametrize(("features", "says"), [
    ({"./mine": "/srv/f.tgz"}, "needs no staging"),
    ({"node": "/srv/f.tgz"}, "is not a Feature from a registry or a URL"),
    ({NODE: "f.tgz"}, "must be an absolute path"),
    ({"ghcr.io/a/b/c": "/srv/1.tgz", "ghcr.io/a/b/c:latest": "/srv/2.tgz"}, "are the same Feature"),
])
def test_a_bad_features_entry_is_refused_naming_it(features, says):
    with pytest.raises(ConfigError) as info:
        config_from_dict({"CONTAINERS": {"features": features}})
    assert any(says in p and "features" in p for p in info.value.problems), info.value.problems


def test_the_node_does_not_start_with_an_archive_it_cannot_use(tmp_path):
    missing = tmp_path / "gone.tgz"
    config = config_from_dict({"STATE_DIR": str(tmp_path), "CONTAINERS": {"enabled": True, "features": {NODE: str(missing)}}})
    with pytest.raises(ClusterSetupError) as info:
        container_settings(config)
    text = str(info.value)
    assert f'[CONTAINERS] features: "{NODE}" = "{missing}": {missing}: No such file or directory' in text, text
    assert "chown root FILE && chmod 644 FILE), or remove the entry" in text, text
    good = tmp_path / "node.tgz"
    good.write_bytes(feature({"id": "node"}))
    os.chmod(good, 0o644)
    written = "GHCR.io/devcontainers/features/node:1"  # kept by the spelling devcontainer.json is matched by
    config = config_from_dict({"STATE_DIR": str(tmp_path), "CONTAINERS": {"enabled": True, "features": {written: str(good)}}})
    staged = container_settings(config).features[NODE]
    assert (staged.path, staged.sha256) == (str(good), hashlib.sha256(good.read_bytes()).hexdigest())


# ---------------------------------------------------------------- the archive


def test_a_registrys_archive_unpacks_into_the_fresh_folder(tmp_path):
    data = feature({"id": "node"}, **{"./lib/helper.sh": "x", "lib/again": link("lib/again", "helper.sh"),
                                      "hard": link("hard", "./lib/helper.sh", tarfile.LNKTYPE)})
    unpack(data, str(tmp_path), "/srv/f/node.tgz")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "devcontainer-feature.json", "hard", "install.sh", "lib", "lib/again", "lib/helper.sh"]
    assert os.stat(tmp_path / "install.sh").st_mode & 0o7777 == 0o755
    assert (tmp_path / "hard").read_text() == "x" and os.readlink(tmp_path / "lib/again") == "helper.sh"
    with pytest.raises(FeatureArchiveError, match="is not empty"):
        unpack(data, str(tmp_path), "/srv/f/node.tgz")


@pytest.mark.parametrize(("more", "says"), [
    ({"/etc/cron.d/x": "boom"}, "has an absolute path"),
    ({"../../x": "boom"}, "climbs out with '..'"),
    ({"lib/../../x": "boom"}, "climbs out with '..'"),
    ({"out": link("out", "/etc")}, "the symlink out -> /etc may leave the Feature's folder"),
    ({"up": link("up", "../../home")}, "the symlink up -> ../../home may leave"),
    ({"dot": link("dot", "."), "dot/x": "through"}, "goes through the symlink dot"),
    ({"h": link("h", "/etc/shadow", tarfile.LNKTYPE)}, "has an absolute path"),
    ({"h": link("h", "nosuch", tarfile.LNKTYPE)}, "the hard link h -> nosuch names no earlier file"),
    ({"dev": link("dev", "", tarfile.CHRTYPE)}, "is a device, FIFO or other special file"),
    ({"install.sh": "again"}, "install.sh is in the archive twice"),
])
def test_a_member_that_could_leave_the_folder_is_refused_naming_the_file(tmp_path, more, says):
    data = feature({"id": "x"}, **more)
    with pytest.raises(FeatureArchiveError) as info:
        unpack(data, str(tmp_path), "/srv/f/x.tgz")
    assert str(info.value).startswith("/srv/f/x.tgz") and says in str(info.value), str(info.value)
    assert not os.listdir(tmp_path)  # checked whole before anything is written


def test_a_damaged_or_incomplete_archive_is_refused_naming_the_file():
    good = feature({"id": "x"})
    for data in (good[: len(good) // 2], b"not an archive", b""):
        with pytest.raises(FeatureArchiveError, match=r"^/srv/f/x.tgz is not a readable tar or tar.gz archive"):
            check(data, "/srv/f/x.tgz")
    with pytest.raises(FeatureArchiveError, match="has no devcontainer-feature.json at its root"):
        check(archive({"x/devcontainer-feature.json": "{}", "x/install.sh": ""}), "/srv/f/x.tgz")
    assert [m.path for m in check(archive({"devcontainer-feature.json": "{}", "install.sh": ""}, gz=False), "t")] == [
        "devcontainer-feature.json", "install.sh"]  # a plain tar too


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as the node reads the archives")
def test_the_node_reads_only_roots_archive_that_no_one_else_writes(tmp_path):
    path = tmp_path / "f.tgz"
    path.write_bytes(feature({"id": "x"}))
    os.chmod(path, 0o644)
    assert read_staged(str(path)).data == path.read_bytes()
    os.chmod(path, 0o664)
    with pytest.raises(FeatureArchiveError, match=r"is not root's alone to write \(owner uid 0, mode 664\)"):
        read_staged(str(path))
    os.chmod(path, 0o644)
    os.chown(path, 1000, 1000)
    with pytest.raises(FeatureArchiveError, match="owner uid 1000"):
        read_staged(str(path))
    os.chown(path, 0, 0)
    (tmp_path / "link.tgz").symlink_to(path)
    with pytest.raises(FeatureArchiveError, match="symbolic links"):
        read_staged(str(tmp_path / "link.tgz"))


# ---------------------------------------------------------------- devcontainer.json with staged Features


def project(tmp_path: Path, features: dict, local: dict[str, dict] | None = None) -> Path:
    dc = tmp_path / "p" / ".devcontainer"
    dc.mkdir(parents=True)
    (dc / "devcontainer.json").write_text(json.dumps({"image": "localhost/base:1", "features": features}))
    for folder, meta in (local or {}).items():
        (dc / folder).mkdir()
        (dc / folder / "devcontainer-feature.json").write_text(json.dumps(meta))
        (dc / folder / "install.sh").write_text("#!/bin/sh\n")
    return tmp_path / "p"


class Node:
    """What the node staged (its key -> devcontainer-feature.json), unpacked as mt-container does."""

    def __init__(self, tmp_path: Path, staged: dict[str, dict]) -> None:
        self.root, self.staged, self.asked = tmp_path / "unpacked", staged, []
        self.root.mkdir()

    def __call__(self, ref: FeatureRef) -> StagedFolder | None:
        self.asked.append(ref.staged_key)
        meta = self.staged.get(ref.staged_key)
        if meta is None:
            return None
        data = feature(meta)
        folder = self.root / str(len(self.asked))
        folder.mkdir()
        unpack(data, str(folder), ref.staged_key)
        return StagedFolder(str(folder), hashlib.sha256(data).hexdigest())


def load(path: Path, node: Node | None):
    return load_devcontainer(path, home=str(path.parent), env={}, staged=node)


def problems(path: Path, node: Node | None) -> dict[str, str]:
    with pytest.raises(DevContainerError) as info:
        load(path, node)
    return {p.key: p.message for p in info.value.problems}


def test_local_and_staged_features_are_read_alike_with_options_and_environment(tmp_path):
    node = Node(tmp_path, {NODE: {"id": "node", "options": {"version": {"type": "string", "default": "lts"},
                                                            "nodeGypDependencies": {"type": "boolean", "default": True}},
                                  "containerEnv": {"NVM_DIR": "/usr/local/share/nvm"}}})
    p = project(tmp_path, {"./hello": {}, "ghcr.io/devcontainers/features/node:1": {"version": "20"}},
                {"hello": {"id": "hello"}})
    d = load(p, node)
    assert [(f.id, f.ref.source) for f in d.features] == [("hello", "local"), ("node", "oci")]
    staged = d.features[1]
    assert dict(staged.options_env) == {"VERSION": "20", "NODEGYPDEPENDENCIES": "true"}
    assert dict(staged.container_env) == {"NVM_DIR": "/usr/local/share/nvm"}
    assert staged.ref.resource == "ghcr.io/devcontainers/features/node" and staged.ref.version == "1"
    assert (Path(staged.ref.folder) / "install.sh").is_file() and len(staged.ref.digest) == 64


def test_an_unstaged_feature_is_refused_naming_it_and_the_key_that_stages_it(tmp_path):
    p = project(tmp_path, {"./hello": {}, "ghcr.io/devcontainers/features/go:1": {}, "https://x.lab/f.tgz": {}},
                {"hello": {"id": "hello"}})
    for node in (Node(tmp_path, {}), None):  # a node with none staged; no node asked at all
        found = problems(p, node)
        assert set(found) == {"features.ghcr.io/devcontainers/features/go:1", "features.https://x.lab/f.tgz"}, found
        go = found["features.ghcr.io/devcontainers/features/go:1"]
        assert go.startswith("the Feature ghcr.io/devcontainers/features/go:1 comes from a registry, which this node "
                             "cannot reach, and it is not staged here: an admin can stage its archive on this node "
                             '([CONTAINERS] features = { "ghcr.io/devcontainers/features/go:1" = '), go
        assert 'name it "./go"' in go and "comes from a URL" in found["features.https://x.lab/f.tgz"]


def test_a_staged_features_depends_on_is_installed_first_when_staged_and_refused_naming_it_when_not(tmp_path):
    node = Node(tmp_path, {NODE: {"id": "node", "dependsOn": {COMMON: {"installZsh": False}}},
                           COMMON: {"id": "common-utils", "options": {"installZsh": {"type": "boolean", "default": True}}}})
    d = load(project(tmp_path / "a", {NODE: {}}), node)
    assert [f.id for f in d.features] == ["common-utils", "node"]
    assert dict(d.features[0].options_env) == {"INSTALLZSH": "false"}
    # given in `features` with the same options too: the same Feature, installed once
    d = load(project(tmp_path / "b", {COMMON: {"installZsh": False}, NODE: {}}), node)
    assert [f.id for f in d.features] == ["common-utils", "node"]
    node.staged.pop(COMMON)
    found = problems(project(tmp_path / "c", {NODE: {}}), node)
    assert set(found) == {f"features.{NODE}.dependsOn"}, found
    assert found[f"features.{NODE}.dependsOn"].startswith(
        f"the Feature node depends on {COMMON}, from a registry, which this node cannot reach, and it is not staged "
        f'here: an admin can stage its archive on this node ([CONTAINERS] features = {{ "{COMMON}" = '), found


def test_installs_after_names_a_registry_feature_by_its_resource_and_rounds_sort_as_the_reference(tmp_path):
    node = Node(tmp_path, {NODE: {"id": "node", "installsAfter": ["ghcr.io/devcontainers/features/common-utils"]},
                           COMMON: {"id": "common-utils"}, "ghcr.io/aaa/features/zz:1": {"id": "zz"}})
    p = project(tmp_path, {NODE: {}, "./local": {}, COMMON: {}, "ghcr.io/aaa/features/zz:1": {}},
                {"local": {"id": "local", "installsAfter": ["ghcr.io/devcontainers/features/node"]}})
    # round 1: the local Feature waits for node, node for common-utils; of the rest, sorted by
    # registry/namespace (ghcr.io/aaa/features before ghcr.io/devcontainers/features)
    assert [f.id for f in load(p, node).features] == ["zz", "common-utils", "node", "local"]
    # different sources in one round: by the keys as written ("./" sorts before letters)
    p = project(tmp_path / "b", {COMMON: {}, "./local": {}}, {"local": {"id": "local"}})
    assert [f.id for f in load(p, node).features] == ["local", "common-utils"]


# ---------------------------------------------------------------- mt-container's side of the node's answer


class FakeNode:
    """The node as mt-container's LocalClient sees it: its name, its record, its staged archives."""

    def __init__(self, archives: dict[str, bytes], user_images: bool = True) -> None:
        self.archives, self.user_images, self.asked = archives, user_images, []

    def __call__(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def health(self):
        return {"node": "node-a"}

    def nodes(self):
        return [{"name": "node-a", "containers": {"user_images": self.user_images}}]

    def podman_env(self, features=None):
        self.asked += features
        return {"features": {k: {"archive": f"/srv/f/{k.rsplit('/', 1)[-1]}.tgz", "sha256": hashlib.sha256(d).hexdigest(),
                                 "data": base64.b64encode(d).decode()}
                             for k in features if (d := self.archives.get(k)) is not None}}


def test_mt_container_unpacks_what_the_node_staged_and_refuses_a_damaged_archive_naming_it(tmp_path, monkeypatch):
    from mtgpu.cli import devcontainer as cli

    p = project(tmp_path, {"ghcr.io/devcontainers/features/node:1": {"version": "20"}})
    node = FakeNode({NODE: feature({"id": "node", "options": {"version": {"type": "string"}}})})
    monkeypatch.setattr(cli, "LocalClient", node)
    with cli.StagedFromNode(str(p)) as staged:
        d = load(p, staged)
        (f,) = d.features
        assert f.id == "node" and dict(f.options_env) == {"VERSION": "20"} and node.asked == [NODE]
        assert Path(f.ref.folder).is_relative_to(staged._dir.name) and (Path(f.ref.folder) / "install.sh").is_file()
    assert not Path(f.ref.folder).exists()  # gone with the build
    node.archives[NODE] = feature({"id": "node"}, **{"../escape": "x"})
    with cli.StagedFromNode(str(p)) as staged:
        found = problems(p, staged)
    assert found[f"features.{NODE}"].startswith("its staged archive cannot be used: /srv/f/node:1.tgz: the member "
                                                "'../escape' climbs out with '..'"), found


def test_mt_container_refuses_any_registry_feature_where_own_images_do_not_run_before_fetching(tmp_path, monkeypatch,
                                                                                             capsys):
    from mtgpu.cli import devcontainer as cli

    p = project(tmp_path, {"ghcr.io/devcontainers/features/node:1": {}})
    node = FakeNode({NODE: feature({"id": "node"})}, user_images=False)
    monkeypatch.setattr(cli, "LocalClient", node)
    with cli.StagedFromNode(str(p)) as staged, pytest.raises(SystemExit) as info:
        load(p, staged)
    assert info.value.code == 2 and node.asked == []
    assert "its Feature ghcr.io/devcontainers/features/node:1 makes an image of your own" in capsys.readouterr().err
