"""Container images built offline for tests: a busybox-static root filesystem imported
into root's Podman store (`podman import`, about 0.2 s), removed afterwards."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

BUSYBOX = "/bin/busybox"


def podman_missing() -> str | None:
    if not shutil.which("podman"):
        return "podman is not installed (apt install podman uidmap slirp4netns catatonit)"
    if not os.path.exists(BUSYBOX):
        return "busybox-static is not installed (apt install busybox-static)"
    return None


def busybox_rootfs(dest: Path) -> Path:
    """A root filesystem keep-id containers run in: busybox, /etc/passwd and /etc/group
    (with a user `dev`, uid 1001 gid 1002, for workspaces mapped onto an image's user),
    a 1777 /tmp."""
    for d in ("bin", "etc", "tmp", "dev", "proc", "sys"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, dest / "bin" / "busybox")
    for applet in subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split():
        link = dest / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    os.chmod(dest / "tmp", 0o1777)
    (dest / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\ndev:x:1001:1002::/tmp:/bin/sh\n"
                                         "nobody:x:65534:65534::/:/bin/sh\n")
    (dest / "etc" / "group").write_text("root:x:0:\ndev:x:1002:\nnogroup:x:65534:\n")
    return dest


def root_podman(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check, timeout=300, **kw)


@contextlib.contextmanager
def busybox_image(name: str | None = None) -> Iterator[str]:
    """A busybox image in root's store, named localhost/mtgpu-test-bb-XXXX:1; removed on exit."""
    name = name or f"localhost/mtgpu-test-bb-{secrets.token_hex(3)}:1"
    with tempfile.TemporaryDirectory(prefix="mtgpu-rootfs-") as d:
        rootfs = busybox_rootfs(Path(d) / "rootfs")
        tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], capture_output=True, check=True).stdout
        r = subprocess.run(["podman", "import", "-", name], input=tar, capture_output=True, timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"podman import failed: {r.stderr.decode(errors='replace')}")
    try:
        yield name
    finally:
        root_podman("rmi", "--force", name, check=False)
