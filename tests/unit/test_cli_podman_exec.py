"""mt-podman names the container an `exec` enters, so the node can move the caller into
that job's cgroup (its GPUs only) before podman starts (issue 24); any other command, or an
exec it cannot read, names none and runs in the GPU-less sessions group."""

from mtgpu.cli.podman import exec_target


def test_the_container_of_an_exec_is_found_past_its_options():
    assert exec_target(["exec", "mtgpu-ws3", "sh"]) == "mtgpu-ws3"
    assert exec_target(["container", "exec", "-it", "mtgpu-ws3", "sh"]) == "mtgpu-ws3"
    assert exec_target(["exec", "-i", "-u", "root", "-e", "A=1", "--workdir", "/w", "mtgpu-ws3", "id"]) == "mtgpu-ws3"
    assert exec_target(["exec", "--env=A=1", "--user=root", "-t", "mtgpu-job4-abc", "true"]) == "mtgpu-job4-abc"
    assert exec_target(["exec", "--", "mtgpu-ws3", "true"]) == "mtgpu-ws3"


def test_other_commands_and_an_exec_without_a_container_name_none():
    assert exec_target(["run", "--rm", "img", "exec"]) is None
    assert exec_target(["ps"]) is None
    assert exec_target([]) is None
    assert exec_target(["exec", "-i", "-u"]) is None
