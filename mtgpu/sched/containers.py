"""Where a container job may run: only on nodes with containers on, and only with an
image the cluster offers (staged on some member, which any member can fetch) or, on a
node with `allow_user_images`, any image of the tenant's own store."""

from __future__ import annotations

from mtgpu.model.cluster import ClusterSnapshot, NodeView


def offered_images(snapshot: ClusterSnapshot) -> frozenset[str]:
    out: set[str] = set()
    for n in snapshot.nodes:
        if n.containers is not None:
            out.update(n.containers.images)
    return frozenset(out)


def container_reason(image: str, node: NodeView, offered: frozenset[str]) -> str | None:
    """Why `node` can never run a job in `image`, or None when it can."""
    c = node.containers
    if c is None:
        return "containers are off there ([CONTAINERS] enabled = false)"
    if image in offered or c.user_images:
        return None
    return (f"image {image} is neither staged ([CONTAINERS] images or templates) nor allowed as a tenant's own "
            "image (allow_user_images = false)")


def cluster_refusal(image: str, snapshot: ClusterSnapshot) -> str | None:
    """The reason no node of the cluster takes `image` at all (for a refusal at submit)."""
    with_containers = [n for n in snapshot.nodes if n.containers is not None]
    if not with_containers:
        return (f"container={image}: no node of this cluster runs containers ([CONTAINERS] enabled = false on "
                "every node); an admin sets [CONTAINERS] enabled = true, or drop container= to run natively")
    offered = offered_images(snapshot)
    if image in offered or any(n.containers.user_images for n in with_containers):
        return None
    allowed = ", ".join(sorted(offered)) or "none"
    return (f"container={image}: the image is not offered by this cluster: staged images are {allowed}, and no "
            "node allows tenants' own images ([CONTAINERS] allow_user_images = false); use one of those or ask an "
            "admin to add it to [CONTAINERS] images")
