"""runArgs and mount strings as the member reads them (mtgpu/workspaces/runargs.py and
mounts.py): whatever a tenant writes comes back as a refusal naming it, never as an
exception that the member answers with 500 or the CLI with a traceback."""

from __future__ import annotations

import pytest

from mtgpu.workspaces.errors import DevContainerError
from mtgpu.workspaces.mounts import parse_mount
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
