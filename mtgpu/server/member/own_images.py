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
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, replace

from ...agent.podman.tenant import TenantPodman, last_error
from ...model.cluster import ClusterSnapshot
from ...model.job import JobSpec
from ...sched.containers import offered_images


class OwnImageError(RuntimeError):
    """The tenant's store could not be read (podman failed); the message says why."""


@dataclass(frozen=True)
class OwnImageCheck:
    """The image to look for in the tenant's store on `node` (the member taking the request)."""

    image: str
    node: str
    others_could: bool  # another member runs tenants' own images too (the job is pinned away from it)


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
    """`podman image exists IMAGE` as the tenant: the lookup `podman run` makes."""
    try:
        r = tenant.run(["image", "exists", image], timeout_s=60)
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
