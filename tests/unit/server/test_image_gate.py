"""A container job waits on a member until its image is there: staged here, or fetched
from a member that staged it and kept only when its digest matches (image_gate.py,
agent/podman/images.py). The fetch here writes real files; no podman is involved."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtgpu.agent.podman.images import ImageError, ImageStore
from mtgpu.agent.podman.setup import ContainerSettings
from mtgpu.server.member.image_gate import FAIL, READY, WAIT, ImageGate
from mtgpu.state import commands as C
from mtgpu.state.machine import StateMachine

IMAGE = "localhost/base:1"
ARCHIVE = b"an image archive\n" * 1000
DIGEST = "sha256:" + hashlib.sha256(ARCHIVE).hexdigest()


def machine_with(**members: dict | None) -> StateMachine:
    m = StateMachine()
    for name, containers in members.items():
        r = m.apply({"cmd": C.NODE_REGISTER, "args": {"name": name, "gpus": [], "cpus": 4, "mem_total_bytes": 1 << 30,
                                                      "at": 0.0, "containers": containers}})
        assert r["ok"], r
    return m


def gate(tmp_path: Path, fetch, **settings) -> tuple[ImageGate, ImageStore]:
    store = ImageStore(tmp_path / "images", root_env={})
    store.setup()
    setup = SimpleNamespace(images=store, settings=ContainerSettings(**settings))
    return ImageGate(setup, fetch, "m1"), store


def wait_verdict(g: ImageGate, machine: StateMachine, state: str):
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        v = g.check(IMAGE, machine)
        if v.state == state:
            return v
        time.sleep(0.01)
    raise AssertionError(f"no {state} verdict: last {v}")


def test_adopt_keeps_an_archive_under_its_digest_and_discards_one_that_does_not_match(tmp_path):
    store = ImageStore(tmp_path, root_env={})
    store.setup()
    (tmp_path / "a.tar").write_bytes(ARCHIVE)
    assert store.adopt(tmp_path / "a.tar", expect=DIGEST) == DIGEST
    assert store.archive(DIGEST).read_bytes() == ARCHIVE
    (tmp_path / "b.tar").write_bytes(ARCHIVE + b"x")
    with pytest.raises(ImageError, match="never loaded"):
        store.adopt(tmp_path / "b.tar", expect=DIGEST)
    assert not (tmp_path / "b.tar").exists()
    with pytest.raises(ImageError):
        store.archive("sha256:../../etc/passwd")


def test_a_job_waits_while_the_image_is_fetched_from_a_member_that_staged_it_then_starts(tmp_path):
    started = []

    def fetch(node: str, digest: str, dest: Path) -> None:
        started.append((node, digest))
        time.sleep(0.2)
        dest.write_bytes(ARCHIVE)

    g, store = gate(tmp_path, fetch)
    m = machine_with(m0={"images": [IMAGE], "staged": {IMAGE: DIGEST}}, m1={"images": []})
    v = g.check(IMAGE, m)
    assert v.state == WAIT and v.message == f"staging image {IMAGE} (fetching it from m0)"
    wait_verdict(g, m, READY)
    assert started == [("m0", DIGEST)] and store.digest_of(IMAGE) == DIGEST


def test_a_fetched_archive_that_fails_its_digest_fails_the_job_and_is_not_kept(tmp_path):
    g, store = gate(tmp_path, lambda node, digest, dest: dest.write_bytes(b"tampered"))
    m = machine_with(m0={"images": [IMAGE], "staged": {IMAGE: DIGEST}}, m1={"images": []})
    assert g.check(IMAGE, m).state == WAIT
    v = wait_verdict(g, m, FAIL)
    assert "fetching it from m0 failed" in v.message and "never loaded" in v.message
    assert store.digest_of(IMAGE) is None and not list((tmp_path / "images").glob("*.tar"))


def test_a_job_waits_for_a_member_still_staging_and_fails_when_every_member_failed(tmp_path):
    g, _ = gate(tmp_path, lambda *a: None)
    m = machine_with(m0={"images": [IMAGE], "staged": {}}, m1={"images": []})
    v = g.check(IMAGE, m)
    assert v.state == WAIT and "waiting for m0 to stage it" in v.message
    m = machine_with(m0={"images": [IMAGE], "staged": {}, "failed": {IMAGE: "could not pull it: unauthorized"}},
                     m1={"images": []})
    v = g.check(IMAGE, m)
    assert v.state == FAIL and "m0: could not pull it: unauthorized" in v.message


def test_a_tenants_own_image_goes_to_podman_where_user_images_are_allowed(tmp_path):
    g, _ = gate(tmp_path, None, allow_user_images=True)
    assert g.check("localhost/mine:1", machine_with(m1={"images": []})).state == READY
    g, _ = gate(tmp_path / "x", None)
    v = g.check("localhost/mine:1", machine_with(m1={"images": []}))
    assert v.state == FAIL and "allow_user_images = false" in v.message
