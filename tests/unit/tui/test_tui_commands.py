"""The `:` command line of the terminal app."""

from __future__ import annotations

import pytest

from mtgpu.tui.commands import Command, CommandError, parse_command, workspace_body


def test_a_command_splits_into_arguments_and_options():
    assert parse_command("cancel 12 cluster=lab") == Command("cancel", ("12",), {"cluster": "lab"})
    assert parse_command("q").name == "quit"


@pytest.mark.parametrize("line, says", [
    ("frobnicate", "no command 'frobnicate'"), ("cancel", "cancel needs more"),
    ("cancel twelve", "takes a job id"), ("create box web", "create from 'template NAME'"), ("", "type a command"),
])
def test_a_command_that_means_nothing_says_what_would(line, says):
    with pytest.raises(CommandError, match=says):
        parse_command(line)


def test_create_builds_the_workspace_request():
    assert workspace_body(parse_command("create template web name=w1")) == {"template": "web", "name": "w1"}
    assert workspace_body(parse_command("create image localhost/base gpus=1 ports=8080,9000")) == {
        "image": "localhost/base", "resources": {"gpus": "1"}, "ports": [8080, 9000]}
