"""Before a container job starts on this member, its image must be here.

An image the cluster offers is staged by the members that list it in `[CONTAINERS]
images` (agent/podman/images.py). When the scheduler places a container job on a member
that lacks the image (the per-node layout), this member fetches the archive from a member
that has it (signed member-to-member HTTP, streamed to disk, its digest verified before
it is kept) and starts the job when it is here; meanwhile the job's reason says "staging
image". An image no member could stage fails the job with the members' reasons.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...agent.podman.setup import ContainerSetup
from ...state.machine import StateMachine

log = logging.getLogger(__name__)

READY, WAIT, FAIL = "ready", "wait", "fail"

# fetch(node_name, digest, dest_path): stream the archive from that member into dest_path
Fetch = Callable[[str, str, Path], None]


@dataclass
class Verdict:
    state: str  # READY, WAIT or FAIL
    message: str = ""


class ImageGate:
    def __init__(self, setup: ContainerSetup | None, fetch: Fetch | None, node_name: str) -> None:
        self.setup = setup
        self.fetch = fetch
        self.node_name = node_name
        self._lock = threading.Lock()
        self._fetching: dict[str, str] = {}  # image -> the member it comes from
        self._failed: dict[str, str] = {}  # image (or "uid:image") -> why the last fetch (or load) failed
        self._loading: set[tuple[int, str]] = set()

    def check(self, image: str, machine: StateMachine, tenant: tuple[int, int, str] | None = None) -> Verdict:
        """Whether a job in `image` may start here now; starts a fetch when one is needed,
        and (with `tenant` = (uid, gid, home)) the load of a staged image into the
        tenant's store, so that no long podman load runs in the agent's loop."""
        setup = self.setup
        if setup is None:
            return Verdict(READY)  # the runner refuses it, saying containers are off here
        st = setup.images.state
        if image in st.ready:
            return self._loaded(image, tenant) if tenant is not None else Verdict(READY)
        with self._lock:
            if image in self._fetching:
                return Verdict(WAIT, f"staging image {image} (fetching it from {self._fetching[image]})")
            failed = self._failed.pop(image, None)
        if failed:
            return Verdict(FAIL, failed)
        if image in st.busy:
            return Verdict(WAIT, f"staging image {image} on {self.node_name}")
        sources = []
        offered_by, failures = [], []
        for rec in machine.nodes.values():
            c = rec.containers
            if rec.name == self.node_name or c is None:
                continue
            if image in c.get("images", ()):
                offered_by.append(rec.name)
            if image in (c.get("failed") or {}):
                failures.append(f"{rec.name}: {c['failed'][image]}")
            digest = (c.get("staged") or {}).get(image)
            if digest and not rec.down:
                sources.append((rec.name, digest))
        if sources and self.fetch is not None:
            name, digest = sorted(sources)[0]
            self._start_fetch(image, name, digest)
            return Verdict(WAIT, f"staging image {image} (fetching it from {name})")
        if setup.settings.allow_user_images and image not in setup.settings.images and not offered_by:
            return Verdict(READY)  # the tenant's own image: podman finds it in the tenant's store or says why
        if image in st.failed:
            failures.insert(0, f"{self.node_name}: {st.failed[image]}")
        pending = [n for n in offered_by if not any(f.startswith(n + ":") for f in failures)]
        local_pending = image in setup.settings.images and image not in st.failed
        if pending or local_pending:
            where = ", ".join(([self.node_name] if local_pending else []) + pending)
            return Verdict(WAIT, f"staging image {image} (waiting for {where} to stage it)")
        if failures:
            return Verdict(FAIL, f"image {image} could not be staged: " + "; ".join(failures))
        if setup.settings.allow_user_images:
            return Verdict(READY)
        return Verdict(FAIL, f"image {image} is not staged on any member and {self.node_name} does not run tenants' "
                             "own images ([CONTAINERS] allow_user_images = false)")

    def _loaded(self, image: str, tenant: tuple[int, int, str]) -> Verdict:
        uid = tenant[0]
        key = (uid, image)
        if self.setup.images.is_loaded(uid, image):
            return Verdict(READY)
        with self._lock:
            if key in self._loading:
                return Verdict(WAIT, f"staging image {image} (loading it into the tenant's store)")
            failed = self._failed.pop(f"{uid}:{image}", None)
            if failed:
                return Verdict(FAIL, failed)
            self._loading.add(key)
        threading.Thread(target=self._load, args=(image, tenant), name=f"load-{uid}", daemon=True).start()
        return Verdict(WAIT, f"staging image {image} (loading it into the tenant's store)")

    def _load(self, image: str, tenant: tuple[int, int, str]) -> None:
        uid, gid, home = tenant
        try:
            t = self.setup.podman.ready(uid, gid, home)
            self.setup.images.ensure_loaded(t, image)
        except Exception as e:  # noqa: BLE001 - any failure fails the job waiting for it, with the reason
            with self._lock:
                self._failed[f"{uid}:{image}"] = str(e)
        finally:
            with self._lock:
                self._loading.discard((uid, image))

    def _start_fetch(self, image: str, source: str, digest: str) -> None:
        with self._lock:
            if image in self._fetching:
                return
            self._fetching[image] = source
        threading.Thread(target=self._fetch, args=(image, source, digest), name=f"fetch-{image}",
                         daemon=True).start()

    def _fetch(self, image: str, source: str, digest: str) -> None:
        store = self.setup.images
        tmp = store.temp_path("fetching")
        t0 = time.monotonic()
        try:
            self.fetch(source, digest, tmp)
            size = tmp.stat().st_size
            got = store.adopt(tmp, expect=digest)
            store.record(image, got)
            dt = time.monotonic() - t0
            log.info("image %s fetched from %s and verified (%s, %.1f MB in %.2fs, %.0f MB/s)", image, source,
                     digest[:19], size / 1e6, dt, size / 1e6 / max(dt, 1e-6))
        except Exception as e:  # noqa: BLE001 - any failure (digest, I/O, HTTP) fails the jobs waiting for it
            tmp.unlink(missing_ok=True)
            why = f"image {image}: fetching it from {source} failed: {e}"
            log.warning("%s", why)
            with self._lock:
                self._failed[image] = why
        finally:
            with self._lock:
                self._fetching.pop(image, None)
