"""Images staged once: content-addressed archives a tenant's first use loads into its own
rootless store.

A root-owned shared image store cannot run rootless containers on this Podman
(TESTING.md), so the node keeps each image as a `podman save` archive named by the
SHA-256 of its bytes (`sha256-HEX.tar`), with `index.json` mapping image names to
digests. `stage()` (root) takes an image from root's store or pulls it (with
`[CONTAINERS] registry_auth_file`, which only root reads) and archives it;
`ensure_loaded()` verifies an archive's digest before a tenant's podman loads it (an
archive that fails its digest is never loaded) and remembers what each tenant has.
`fetch_from()` takes an archive from another member (members.py streams it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .tenant import PODMAN, TenantPodman, last_error

log = logging.getLogger(__name__)

CHUNK = 1 << 20
INDEX = "index.json"


class ImageError(RuntimeError):
    """An image could not be staged, verified or loaded; the message names it and why."""


@dataclass
class StageState:
    """Where each configured image stands on this node."""

    ready: dict[str, str] = field(default_factory=dict)  # name -> digest "sha256:HEX"
    failed: dict[str, str] = field(default_factory=dict)  # name -> why
    busy: set[str] = field(default_factory=set)


def archive_image_id(path: Path) -> str:
    """The image id (its config's sha256) of a `podman save --format docker-archive` archive,
    read from the archive's manifest.json: the id the image has in any store it is loaded into."""
    with tarfile.open(path, "r:") as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ValueError("no manifest.json in the archive")
        manifest = json.load(member)
    config = str(manifest[0]["Config"])
    hexd = config.rsplit("/", 1)[-1].removesuffix(".json")
    if hexd.startswith("sha256:"):
        hexd = hexd[len("sha256:"):]
    if len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
        raise ValueError(f"the archive's config {config!r} does not name an image id")
    return hexd


def _signature(path: Path) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
    return "sha256:" + h.hexdigest()


class ImageStore:
    def __init__(self, directory: Path, root_env: dict[str, str], auth_file: Path | None = None):
        self.dir = Path(directory)
        self.root_env = root_env
        self.auth_file = auth_file
        self.state = StageState()
        self._lock = threading.Lock()
        self._loaded: dict[int, set[str]] = {}  # uid -> digests loaded into its store
        self._ids: dict[str, str] = {}  # archive digest -> the image id inside
        self._verified: dict[str, tuple] = {}  # digest -> the archive's signature when this process hashed it

    # ------------------------------------------------------------ the index
    def setup(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o711)
        for name, digest in self._read_index().items():
            if self.archive(digest).exists():
                self.state.ready[name] = digest

    def archive(self, digest: str) -> Path:
        algo, _, hexd = digest.partition(":")
        if algo != "sha256" or len(hexd) != 64 or not all(c in "0123456789abcdef" for c in hexd):
            raise ImageError(f"{digest!r} is not a sha256 digest")
        return self.dir / f"sha256-{hexd}.tar"

    def _read_index(self) -> dict[str, str]:
        try:
            doc = json.loads((self.dir / INDEX).read_text())
            return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            return {}

    def record(self, name: str, digest: str) -> None:
        with self._lock:
            index = self._read_index()
            index[name] = digest
            tmp = self.dir / (INDEX + ".tmp")
            tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.dir / INDEX)
            self.state.ready[name] = digest
            self.state.failed.pop(name, None)

    def temp_path(self, what: str) -> Path:
        """A file name no other writer uses, also on shared storage written by several nodes."""
        return self.dir / f".{what}-{socket.gethostname()}-{os.getpid()}-{threading.get_ident()}.tar"

    def digest_of(self, name: str) -> str | None:
        return self.state.ready.get(name)

    # ------------------------------------------------------------ staging (root)
    def _root_podman(self, args: list[str], timeout_s: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run([PODMAN, *args], env=self.root_env, capture_output=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL, cwd="/")

    def stage(self, name: str) -> str:
        """Archive `name` from root's store, pulling it first when it is not there;
        returns its digest. Raises ImageError with podman's message."""
        with self._lock:
            self.state.busy.add(name)
        try:
            if self._root_podman(["image", "exists", name], 60).returncode != 0:
                args = ["pull", "--quiet"]
                if self.auth_file is not None:
                    args += ["--authfile", str(self.auth_file)]
                r = self._root_podman(args + [name])
                if r.returncode != 0:
                    raise ImageError(f"image {name}: could not pull it: {last_error(r)}")
            tmp = self.temp_path("staging")
            tmp.unlink(missing_ok=True)
            try:
                digest = self._save_hashing(name, tmp)
            except ImageError:
                tmp.unlink(missing_ok=True)
                raise
            digest = self.adopt(tmp, digest=digest)
            self.record(name, digest)
            return digest
        except ImageError as e:
            with self._lock:
                self.state.failed[name] = str(e)
            raise
        except (OSError, subprocess.TimeoutExpired) as e:
            with self._lock:
                self.state.failed[name] = f"image {name}: {e}"
            raise ImageError(f"image {name}: {e}") from e
        finally:
            with self._lock:
                self.state.busy.discard(name)

    def _save_hashing(self, name: str, dest: Path, tenant: TenantPodman | None = None) -> str:
        """`podman save` (root's, or `tenant`'s) into `dest`, hashed as it is written (one
        pass over the bytes)."""
        h = hashlib.sha256()
        who = {"env": tenant.env(), "user": tenant.uid, "group": tenant.gid, "extra_groups": []} if tenant \
            else {"env": self.root_env}
        with tempfile.TemporaryFile() as err, open(dest, "xb") as out:
            p = subprocess.Popen([PODMAN, "save", "--quiet", "--format", "docker-archive", name], **who,
                                 stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd="/")
            assert p.stdout is not None
            try:
                while chunk := p.stdout.read(CHUNK):
                    h.update(chunk)
                    out.write(chunk)
            finally:
                p.stdout.close()
                rc = p.wait(timeout=1800)
            if rc != 0:
                err.seek(0)
                r = subprocess.CompletedProcess(p.args, rc, b"", err.read())
                raise ImageError(f"image {name}: could not save it: {last_error(r)}")
            out.flush()
            os.fsync(out.fileno())
        return "sha256:" + h.hexdigest()

    def stage_from_tenant(self, tenant: TenantPodman, image_id: str, name: str) -> str:
        """Stage an image of a tenant's store (a saved workspace) as `name`: archived from
        the tenant's podman, verified and offered like any staged image; returns its digest."""
        tmp = self.temp_path("saving")
        tmp.unlink(missing_ok=True)
        try:
            digest = self._save_hashing(image_id, tmp, tenant)
        except (ImageError, OSError, subprocess.TimeoutExpired):
            tmp.unlink(missing_ok=True)
            raise
        digest = self.adopt(tmp, digest=digest)
        self.record(name, digest)
        self._loaded.setdefault(tenant.uid, set()).add(digest)  # it came from that store
        return digest

    def adopt(self, tmp: Path, expect: str | None = None, digest: str | None = None) -> str:
        """Move a finished archive to its content address; with `expect`, it must match.
        `digest`: already computed while the archive was written (not read again)."""
        digest = digest or file_digest(tmp)
        if expect is not None and digest != expect:
            tmp.unlink(missing_ok=True)
            raise ImageError(f"the archive's digest is {digest}, not the {expect} asked for: discarded, never loaded")
        os.chmod(tmp, 0o644)
        final = self.archive(digest)
        os.replace(tmp, final)
        self._verified[digest] = _signature(final)
        return digest

    def _still_verified(self, digest: str, path: Path) -> bool:
        """This process hashed the archive and it is unchanged since (same file, size and
        modification time; only root can write it): no need to read it again."""
        try:
            return self._verified.get(digest) == _signature(path)
        except OSError:
            return False

    def stage_all(self, names: list[str]) -> None:
        """Stage every name not staged yet (each failure is logged and kept, never fatal)."""
        for name in names:
            if name in self.state.ready:
                continue
            known = self._read_index().get(name)  # staged meanwhile by another node sharing the folder
            if known and self.archive(known).exists():
                self.state.ready[name] = known
                self.state.failed.pop(name, None)
                continue
            t0 = time.monotonic()
            try:
                digest = self.stage(name)
                log.info("staged image %s as %s in %.1fs", name, digest[:19], time.monotonic() - t0)
            except ImageError as e:
                log.warning("%s", e)

    def stage_retrying(self, names: list[str], first_wait_s: float = 30.0, max_wait_s: float = 600.0,
                       stop: threading.Event | None = None) -> None:
        """Stage every name; retry the ones that failed (a registry that was down when the
        node started) with a growing wait, until each is staged or `stop` is set."""
        wait = first_wait_s
        stop = stop or threading.Event()
        while True:
            self.stage_all(names)
            left = [n for n in names if n not in self.state.ready]
            if not left or stop.wait(wait):
                return
            log.info("staging again in %.0fs: %s", wait, ", ".join(left))
            wait = min(max_wait_s, wait * 2)

    def start_staging(self, names: list[str]) -> threading.Thread:
        t = threading.Thread(target=self.stage_retrying, args=(list(names),), name="image-staging", daemon=True)
        t.start()
        return t

    # ------------------------------------------------------------ loading (as the tenant)
    def ensure_loaded(self, tenant: TenantPodman, name: str) -> tuple[str, str] | None:
        """Make the staged image `name` present in the tenant's store (loaded from its
        verified archive on first use); returns (digest, image id), or None when the image
        is not a staged one (the tenant's own image: podman finds it or says why).

        Jobs run the image by its id, never by its name: a tenant can put anything under a
        name in its own store (`podman tag`, `commit`), but not under a content-addressed id."""
        digest = self.state.ready.get(name)
        if digest is None:
            return None
        path = self.archive(digest)
        image_id = self._ids.get(digest)
        if image_id is None:
            try:
                image_id = self._ids[digest] = archive_image_id(path)
            except (OSError, ValueError, KeyError, tarfile.TarError) as e:
                raise ImageError(f"image {name}: its archive {path} cannot be read: {e}") from None
        if digest in self._loaded.get(tenant.uid, set()):
            return digest, image_id
        if tenant.run(["image", "exists", image_id], timeout_s=60).returncode != 0:
            if self._still_verified(digest, path):
                got = digest
            else:
                sig = _signature(path)
                got = file_digest(path)
                if got == digest and _signature(path) == sig:
                    self._verified[digest] = sig
            if got != digest:
                raise ImageError(f"image {name}: the archive {path} has digest {got}, not {digest}: it was changed "
                                 "on disk and is never loaded; remove it and restart the node to stage the image again")
            with open(path, "rb") as f:
                r = tenant.run(["load", "--quiet"], timeout_s=1800, stdin=f)
            if r.returncode != 0:
                raise ImageError(f"image {name}: podman load failed: {last_error(r)}")
        self._loaded.setdefault(tenant.uid, set()).add(digest)
        return digest, image_id

    def is_loaded(self, uid: int, name: str) -> bool:
        """The staged image `name` is in this tenant's store (as far as this node knows)."""
        digest = self.state.ready.get(name)
        return digest is not None and digest in self._loaded.get(uid, set())

