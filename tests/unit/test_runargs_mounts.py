"""runArgs and mount strings as the member reads them (mtgpu/workspaces/runargs.py and
mounts.py): whatever a tenant writes comes back as a refusal naming it, never as an
exception that the member answers with 500 or the CLI with a traceback."""

from __future__ import annotations

import pytest

from mtgpu.workspaces.errors import DevContainerError
from mtgpu.workspaces.mounts import Mount, bind_mount_arg, parse_mount
from mtgpu.workspaces.runargs import check_run_args, host_sources

HOME = "/home/alice"


@pytest.mark.parametrize("value", ["type=bind,source=/home/alice/a\nb,target=/x",
                                   "type=bind,source=/home/alice/a\rb,target=/x",
                                   "type=bind,\"source=/home/alice/a\nb\",target=/x"])
def test_a_mount_string_with_a_line_break_is_refused_naming_it(value):
    """csv.reader raised its own Error ('new-line character seen in unquoted field') from a
    `--mount` value or a devcontainer `mounts` string: a 500 from the member's check of
    runArgs, a traceback from the CLI."""
    with pytest.raises(DevContainerError) as e:
        parse_mount(value, "mounts[0]")
    assert e.value.problems[0].key == "mounts[0]"
    assert "line break" in e.value.problems[0].message
    problems = check_run_args(["--mount", value], HOME)
    assert [p.key for p in problems] == ["runArgs[0]"] and "line break" in problems[0].message
    assert host_sources(["--mount", value]) == []  # refused by check_run_args, not a host path


def test_a_mount_field_longer_than_csv_reads_is_refused_naming_it():
    """csv's field limit (131,072 characters): a devcontainer.json the CLI reads has no
    length limit of its own before the member's."""
    value = "type=bind,target=/x,source=/home/alice/" + "a" * 140_000
    with pytest.raises(DevContainerError) as e:
        parse_mount(value, "mounts[0]")
    assert "cannot be read as comma-separated key=value fields (field larger than field limit" in str(e.value)


def test_an_overlay_volumes_upperdir_and_workdir_are_host_paths_kept_in_the_home_too():
    """`-v SRC:DST:O,upperdir=DIR,workdir=DIR` (podman's persistent overlay volume) names two
    more host folders, which the home rule did not look at: the container saw /etc merged
    over a folder of the home, and wrote into DIR."""
    args = ["-v", "/home/alice/src:/w:O,upperdir=/etc,workdir=/home/alice/work"]
    problems = check_run_args(args, HOME)
    assert len(problems) == 1 and "upperdir=/etc is outside your home /home/alice" in problems[0].message, problems
    assert "workdir" in check_run_args(["-v", "/home/alice/s:/w:O,upperdir=/home/alice/u,workdir=../w"],
                                       HOME)[0].message
    assert check_run_args(["-v", "/home/alice/s:/w:O,upperdir=/home/alice/u,workdir=/home/alice/w"], HOME) == []
    assert [s for _k, _v, s in host_sources(args)] == ["/home/alice/src", "/etc", "/home/alice/work"]


@pytest.mark.parametrize("source,target", [("/home/alice/we:ird,name", "/data:1,2"), ('/home/alice/say "hi"', "/w"),
                                           ("/home/alice/a=b", "/x")])
def test_a_bind_of_any_folder_name_is_one_mount_value_read_back_whole(source, target):
    """What the member hands podman as `--mount` (podman 4.3 reads it as CSV, as parse_mount
    does): a ',' or '"' in a path is quoted, so the path comes back whole; `-v` would cut it at ':'."""
    value = bind_mount_arg(source, target, read_only=True)
    assert parse_mount(value, "mounts[0]") == Mount("bind", target, source, True)
