"""`mt-job gpus`' reading of an open (mtgpu/cli/attach.py): EPERM is the device cgroup's
fence; ENXIO (no driver behind the node, a simulated GPU) and EACCES (a DRM node's file
mode) got past it; ENOENT is no node at all. The errors are stand-ins for os.open's; the
real opens are tests/integration/test_session_gpus.py's."""

from __future__ import annotations

import errno
import os

import pytest

from mtgpu.cli import attach


@pytest.fixture
def opened(monkeypatch):
    """os.open answers each path with the error named for it (0: opens); the opened paths."""
    answers: dict[str, int] = {}
    seen: list[str] = []
    real_open = os.open  # attach.os is the os module: the patch below is os.open's

    def fake_open(path, flags, *rest):
        seen.append(path)
        assert flags & os.O_NONBLOCK and flags & os.O_CLOEXEC, flags  # a tty or a FIFO never blocks the view
        code = answers[path]
        if code:
            raise OSError(code, os.strerror(code), path)
        return real_open(os.devnull, os.O_RDONLY)

    monkeypatch.setattr(attach.os, "open", fake_open)
    return answers, seen


@pytest.mark.parametrize("code, expected", [
    (errno.EPERM, False),  # the fence
    (errno.ENXIO, True),  # past the fence, no driver
    (errno.EACCES, True),  # past the fence, the file's mode
    (errno.ENOENT, None),  # no such node here
    (errno.EBUSY, True),  # the driver answered: past the fence
    (0, True),
])
def test_opens_tells_the_fence_from_the_other_errors(opened, code, expected):
    answers, seen = opened
    answers["/dev/g"] = code
    assert attach.opens("/dev/g") is expected
    assert seen == ["/dev/g"]


def test_opens_a_real_file_and_a_missing_one():
    assert attach.opens(os.devnull) is True
    assert attach.opens("/nonexistent/mtgpu-no-such-node") is None


def test_openable_keeps_a_gpu_only_when_no_node_of_it_is_fenced(opened):
    answers, _ = opened
    answers.update({"/g0": errno.ENXIO, "/g1": errno.EPERM, "/c2": errno.EACCES, "/r2": errno.ENXIO,
                    "/c3": errno.EACCES, "/r3": errno.EPERM, "/gone": errno.ENOENT})
    gpus = [{"index": 0, "devices": ["/g0"]},
            {"index": 1, "devices": ["/g1"]},
            {"index": 2, "devices": ["/c2", "/r2"]},  # an AMD/Intel GPU: card and render node
            {"index": 3, "devices": ["/c3", "/r3"]},  # one of its nodes fenced: not this process's
            {"index": 4, "devices": ["/gone"]},  # its node absent here: nothing fences it
            {"index": 5, "devices": []},  # no node known: not fenced
            {"index": 6}]
    assert [g["index"] for g in attach.openable(gpus)] == [0, 2, 4, 5, 6]


def test_openable_of_fenced_gpus_only_is_empty(opened):
    answers, _ = opened
    answers.update({"/g0": errno.EPERM, "/g1": errno.EPERM})
    assert attach.openable([{"index": 0, "devices": ["/g0"]}, {"index": 1, "devices": ["/g1"]}]) == []
