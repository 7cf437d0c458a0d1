"""The `:` command line of the terminal app."""

from __future__ import annotations

import pytest

from mtgpu.tui.commands import Command, CommandError, devcontainer_command, parse_command, workspace_body


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


@pytest.mark.parametrize("line, says", [
    ("create template web colour=red", "create template takes no colour="),
    ("create devcontainer proj gpus=1", "create devcontainer takes no gpus=; it takes name=, node=, cluster="),
    ("cancel 3 node=a", "cancel takes no node=; it takes cluster="),
    ("refresh now=1", "refresh takes no now="),
    ("create devcontainer ~/my proj", "create takes 2 arguments, not 'devcontainer ~/my proj' .quote a path"),
    ("cancel 3 4", "cancel takes 1 argument, not '3 4'"), ("sort node up", "'up' is not desc"),
])
def test_an_option_a_command_does_not_take_is_refused_not_dropped(line, says):
    with pytest.raises(CommandError, match=says):
        parse_command(line)


def test_a_filter_keeps_its_words_with_equals_signs():
    assert parse_command("filter state=running gpu") == Command("filter", ("state=running", "gpu"))


def test_create_devcontainer_runs_mt_container_in_the_home_on_the_node():
    assert devcontainer_command(parse_command("create devcontainer ~/my name=dc")) == \
        "mt-container create --devcontainer my --name dc"
    assert devcontainer_command(parse_command("create devcontainer '~/my proj' node=a")) == \
        "mt-container create --devcontainer 'my proj'"
    assert devcontainer_command(parse_command("create devcontainer /srv/p/.devcontainer/devcontainer.json")) == \
        "mt-container create --devcontainer /srv/p/.devcontainer/devcontainer.json"
