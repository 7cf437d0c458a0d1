"""A job (or workspace) in a tenant's own image, where `[CONTAINERS] allow_user_images`
lets it: checked at submit, so that an image that exists nowhere is refused then, not
failed later by podman.

A tenant's image store is per member (agent/podman/tenant.py: the graph root is under
STATE_DIR, node-local), so a member sees only the tenant's store on itself. The rule
(docs/CONTAINERS.md "Allowed images"):

- an image the cluster offers (staged or a template on some member, a saved workspace)
  is the cluster's, and is never looked for in a tenant's store;
- otherwise, when the member taking the request runs tenants' own images and the job may
  run on it (one node, no `server=` naming another member, this one not excluded), the
  image must be in the tenant's store here: refused at once when it is not, naming the
  image and how to put it there; when it is, the job is pinned here (`server=`), the one
  member known to hold it, as a devcontainer `build` is;
- otherwise (a `server=` naming another member, a multi-node job, a member that does not
  run tenants' own images) the store that counts cannot be seen from here: the job is
  accepted, and the member that starts it fails it with podman's message when the image
  is not in the tenant's store there.

Wherever it is looked for, an image the cluster does not offer must be written as an image
reference (`name_problem`): podman is handed it as an argument, and a name such as `--help`
(a workspace's --image is free text) was read as an option, `podman image exists --help`
answering 0 ("found"), and `Foo:1` answered 500 with podman's "must be lowercase".
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, replace

from ...agent.podman.tenant import TenantPodman, last_error
from ...model.cluster import ClusterSnapshot
from ...model.job import JobSpec
from ...sched.containers import offered_images


# containers/image's docker/reference grammar (ASCII only): [DOMAIN/]PATH[:TAG][@DIGEST]
_DOMAIN_PART = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = re.compile(rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?")
_PATH_PART = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")
MAX_NAME_CHARS = 255
_NAME_FIX = "write it as [REGISTRY/]NAME[:TAG][@DIGEST], the NAME in lower case (e.g. localhost/my-image:1)"


def name_problem(image: str) -> str | None:
    """Why `image` is not an image reference podman can look up (None when it is), with
    the fix: what the tenant's own podman would refuse, found before it is asked."""
    if image.startswith("sha256:") and not re.fullmatch(r"sha256:[0-9a-f]{64}", image):  # podman: an image id
        return f"image {image!r} is not an image id: sha256: takes 64 hexadecimal digits; {_NAME_FIX}"
    name, at, digest = image.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        return f"image {image!r} has a digest that is not ALGORITHM:HEX ({digest!r}); {_NAME_FIX}"
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        name, tag = name[:colon], name[colon + 1:]
        if not _TAG.fullmatch(tag):
            return (f"image {image!r} has a tag that is not 1-128 letters, digits, '_', '.' and '-' ({tag!r}); "
                    f"{_NAME_FIX}")
    if len(name) > MAX_NAME_CHARS:
        return f"image {image[:80]!r}... has a name of {len(name)} characters, more than {MAX_NAME_CHARS}"
    first, sep, rest = name.partition("/")
    # a registry, as podman reads one: with a '.' or ':', localhost, or any upper-case letter
    if sep and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        if not _DOMAIN.fullmatch(first):
            return f"image {image!r} names the registry {first!r}, which is not a host name[:port]; {_NAME_FIX}"
        name = rest
    for part in name.split("/"):
        if not _PATH_PART.fullmatch(part):
            why = "is not in lower case" if _PATH_PART.fullmatch(part.lower()) else \
                "is not lower-case letters and digits joined by '.', '_', '__' or '-'"
            return f"image {image!r} is not an image name: {part!r} {why}; {_NAME_FIX}"
    return None


class OwnImageError(RuntimeError):
    """The tenant's store could not be read (podman failed); the message says why."""


@dataclass(frozen=True)
class OwnImageCheck:
    """The image to look for in the tenant's store on `node` (the member taking the request)."""

    image: str
    node: str
    others_could: bool  # another member runs tenants' own images too (the job is pinned away from it)


def unreadable_image(spec: JobSpec, snapshot: ClusterSnapshot) -> str | None:
    """Why the job's image, one the cluster does not offer (a tenant's own, on whichever
    member), is not an image name podman can read; None when it is (or is offered)."""
    image = spec.container
    if not image or image in offered_images(snapshot):
        return None
    return name_problem(image)


def own_image_check(spec: JobSpec, snapshot: ClusterSnapshot, here: str) -> OwnImageCheck | None:
    """What to check at submit for `spec` on member `here`, or None when nothing can be."""
    image = spec.container
    if not image or image in offered_images(snapshot):
        return None
    mine = next((n for n in snapshot.nodes if n.name == here), None)
    if mine is None or mine.containers is None or not mine.containers.user_images:
        return None
    if spec.nodes != 1 or spec.server not in (None, here) or here in spec.exclude:
        return None
    others = any(n.name != here and n.containers is not None and n.containers.user_images for n in snapshot.nodes)
    return OwnImageCheck(image, here, others)


def in_store(tenant: TenantPodman, image: str) -> bool:
    """`podman image exists IMAGE` as the tenant: the lookup `podman run` makes (`image`
    passed name_problem; after "--", so that it is never read as an option)."""
    try:
        r = tenant.run(["image", "exists", "--", image], timeout_s=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OwnImageError(f"podman could not be asked about image {image}: {e}") from None
    if r.returncode in (0, 1):
        return r.returncode == 0
    raise OwnImageError(f"podman could not look for image {image} in your store: {last_error(r)}")


def missing(check: OwnImageCheck, tenant_name: str) -> str:
    """The refusal: the image, where it was looked for, and the ways to put it there."""
    return (f"container={check.image}: no such image in {tenant_name}'s own store on {check.node}, and the cluster "
            f"does not offer it; put it there first, on {check.node} (`mt-podman load -i FILE.tar`, or `mt-podman "
            f"build -t {check.image} DIR`), name an image the cluster offers, or give server=MEMBER for the member "
            "whose store holds it")


def pinned(spec: JobSpec, check: OwnImageCheck) -> tuple[JobSpec, str | None]:
    """The job pinned to the member whose store holds its image, and a note for the
    submitter when another member could otherwise have taken it."""
    if spec.server == check.node:
        return spec, None
    note = (f"container={check.image} is your own image, in your store on {check.node}: the job runs there "
            "(give server=MEMBER to run it on another member, after loading the image into your store there)"
            if check.others_could else None)
    return replace(spec, server=check.node), note
