"""mtgpu-setup upgrade's checks of the new package, without installing anything: what
--from may be (this checkout, a wheel with the client's beside it), and which upgrades
are refused before any change."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from mtgpu.setup.environment import package_version
from mtgpu.setup.layout import Layout
from mtgpu.setup.plan import SetupRefused
from mtgpu.setup.upgrade import Installed, check_upgrade, inspect_package, rewrite_scripts, version_key
from mtgpu.state.commands import STATE_FORMAT

REPO = Path(__file__).resolve().parents[2]


def make_wheel(folder: Path, version: str, state_format: int | None = 2, client: bool = True) -> Path:
    wheel = folder / f"mtgpu-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"mtgpu-{version}.dist-info/METADATA",
                   f"Metadata-Version: 2.1\nName: mtgpu\nVersion: {version}\nRequires-Dist: mtgpu-client=="
                   f"{version}\nRequires-Dist: httpx>=0.27\nRequires-Dist: pytest>=8; extra == \"test\"\n\nabout\n")
        if state_format is not None:
            z.writestr("mtgpu/state/commands.py", f"X = 1\nSTATE_FORMAT = {state_format}  # the newest\n")
    if client:
        (folder / f"mtgpu_client-{version}-py3-none-any.whl").write_bytes(b"")
    return wheel


def installed(version: str, state_format: int | None) -> Installed:
    return Installed(Layout.make("/srv/image"), None, Path("/srv/image/var/lib/mtgpu/mtgpu.sock"), version,
                     state_format)


def test_this_checkout_is_a_package_with_its_version_state_format_and_the_client_first():
    new = inspect_package(REPO)
    assert new.kind == "source folder" and new.version == package_version(REPO)
    assert new.state_format == STATE_FORMAT
    assert new.pip_targets == (str(REPO / "clients" / "python"), str(REPO))
    assert any(r.startswith("mtgpu-client==") for r in new.requires)


def test_a_folder_that_is_not_mtgpu_is_refused_naming_it_and_what_to_give(tmp_path):
    with pytest.raises(SetupRefused) as e:
        inspect_package(tmp_path)
    assert f"--from '{tmp_path}' holds no pyproject.toml of mtgpu" in str(e.value)
    assert "give the folder of an mtgpu checkout" in str(e.value) and "mtgpu wheel" in str(e.value)
    with pytest.raises(SetupRefused, match="does not exist"):
        inspect_package(tmp_path / "missing")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SetupRefused, match="neither a folder nor a .whl file"):
        inspect_package(tmp_path / "notes.txt")


def test_a_wheel_gives_its_version_requirements_and_state_format_and_needs_the_client_beside_it(tmp_path):
    new = inspect_package(make_wheel(tmp_path, "0.3.0", state_format=3))
    assert (new.kind, new.version, new.state_format) == ("wheel", "0.3.0", 3)
    assert "httpx>=0.27" in new.requires
    assert new.pip_targets[0] == str(tmp_path / "mtgpu_client-0.3.0-py3-none-any.whl")
    other = tmp_path / "alone"
    other.mkdir()
    with pytest.raises(SetupRefused) as e:
        inspect_package(make_wheel(other, "0.3.0", client=False))
    assert "mtgpu_client-0.3.0-py3-none-any.whl is not beside it" in str(e.value) and "pip wheel" in str(e.value)
    foreign = tmp_path / "numpy-2.0-py3-none-any.whl"
    foreign.write_bytes(b"")
    with pytest.raises(SetupRefused, match="is not a wheel of mtgpu"):
        inspect_package(foreign)
    broken = tmp_path / "mtgpu-9.9-py3-none-any.whl"
    broken.write_bytes(b"not a zip")
    with pytest.raises(SetupRefused, match="cannot be read as a wheel"):
        inspect_package(broken)


def test_the_same_version_and_a_downgrade_below_the_state_format_are_refused(tmp_path):
    with pytest.raises(SetupRefused, match="holds already: nothing to upgrade"):
        check_upgrade(installed("0.3.0", 3), inspect_package(make_wheel(tmp_path, "0.3.0")))
    with pytest.raises(SetupRefused) as e:
        check_upgrade(installed("0.10.0", 3), inspect_package(make_wheel(tmp_path, "0.9.0", state_format=2)))
    assert "mtgpu 0.9.0 (state format 2), older than the 0.10.0 installed (state format 3)" in str(e.value)
    assert "restore a backup taken under the older version" in str(e.value)
    # a package from before state formats is format 1
    with pytest.raises(SetupRefused, match="state format 1"):
        check_upgrade(installed("0.10.0", 2), inspect_package(make_wheel(tmp_path, "0.8.0", state_format=None)))
    check_upgrade(installed("0.10.0", 2), inspect_package(make_wheel(tmp_path, "0.9.1", state_format=2)))
    check_upgrade(installed("0.1.0", None), inspect_package(make_wheel(tmp_path, "0.2.0", state_format=2)))


def test_versions_compare_by_their_release_numbers():
    assert version_key("0.10.0") > version_key("0.9.9") and version_key("1.2.3+local") == (1, 2, 3)


def test_scripts_pip_wrote_in_the_environment_built_aside_name_its_final_place(tmp_path):
    built, final = tmp_path / "venv.next", tmp_path / "venv"
    (built / "bin").mkdir(parents=True)
    (built / "bin" / "mt-job").write_text(f"#!{built}/bin/python\nimport sys\n")
    (built / "bin" / "mtgpu-relay").write_text(f"#!{final}/bin/python\n")  # copied from the old one: right already
    (built / "bin" / "python").symlink_to("/usr/bin/python3")
    rewrite_scripts(built, final)
    assert (built / "bin" / "mt-job").read_text() == f"#!{final}/bin/python\nimport sys\n"
    assert (built / "bin" / "mtgpu-relay").read_text() == f"#!{final}/bin/python\n"
