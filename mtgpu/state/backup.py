"""Backups of a node's state (issue 29 point 2, docs/INSTALL.md "Backup and restore").

`mtgpu-admin backup FILE` asks the running node for its state machine, taken whole under
the state's lock (a consistent copy: every command applied or none), and writes it with a
header and a checksum of its exact bytes (state/checksums.py, as the journal's lines).
`mtgpu-setup restore FILE` reads it back into a stopped standalone node's STATE_DIR as its
snapshot, after `prepare_restore`: a job that ran when the backup was taken did not run on
this machine, so it is requeued as a new attempt (or `lost`, for `requeue=no`), its history
saying so, and is never taken for running. Everything else (the queue, finished jobs'
records, tenants with their uid/gid and keys, invitations, usage) is kept as it was.

A file from a newer format, or whose bytes changed, is refused naming why.
"""

from __future__ import annotations

import json

from . import commands as C
from .checksums import ChecksumMismatch, open_json, seal_json
from .machine import StateMachine

FORMAT = "mtgpu-backup"
FORMAT_VERSION = 1       # of this file's header; a newer one is refused


def mtgpu_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mtgpu")
    except PackageNotFoundError:
        return "unknown"


class BackupError(Exception):
    """A backup that cannot be read or used: the message names why and the fix."""


def backup_document(machine: StateMachine, node: str, cluster_id: str | None, mode: str, at: float,
                    mtgpu_version: str) -> dict:
    """What `mtgpu-admin backup` writes (call under the state's lock: a consistent copy)."""
    state = machine.to_dict()
    jobs = state["jobs"]
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "mtgpu_version": mtgpu_version,
            "created_at": at, "node": node, "cluster_id": cluster_id, "mode": mode,
            "summary": {"jobs": len(jobs), "queued": sum(1 for j in jobs if j["state"] == "queued"),
                        "running": sum(1 for j in jobs if j["state"] == "running"),
                        "tenants": len(state["tenants"]), "applied": state["applied"]},
            "state": state}


def encode(document: dict) -> bytes:
    return seal_json(json.dumps(document, separators=(",", ":")).encode()) + b"\n"


def decode(data: bytes, where: str) -> dict:
    """The document of a backup file's bytes; raises BackupError naming what is wrong."""
    try:
        body, sealed = open_json(data.rstrip(b"\n"))
    except ChecksumMismatch as e:
        raise BackupError(f"{where} is damaged: {e} (its bytes changed since it was written); "
                          "use another backup") from None
    if not sealed:
        raise BackupError(f"{where} is not an mtgpu backup (no checksum at its start): give a file "
                          "`mtgpu-admin backup` wrote")
    try:
        doc = json.loads(body)
    except ValueError as e:
        raise BackupError(f"{where} cannot be read as JSON ({e}); use another backup") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BackupError(f"{where} is not an mtgpu backup (format {doc.get('format') if isinstance(doc, dict) else None!r})")
    version = doc.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BackupError(f"{where} was written by a newer mtgpu ({doc.get('mtgpu_version')}, backup format "
                          f"{version}); this one reads format {FORMAT_VERSION}: upgrade mtgpu here first")
    state = doc.get("state")
    if not isinstance(state, dict) or not isinstance(state.get("version"), int):
        raise BackupError(f"{where} holds no state; use another backup")
    if state["version"] > C.STATE_FORMAT:
        raise BackupError(f"{where} holds a state of version {state['version']}, newer than this mtgpu reads "
                          f"({C.STATE_FORMAT}): upgrade mtgpu here first")
    return doc


def restored_machine(doc: dict, at: float, where: str) -> tuple[StateMachine, list[str]]:
    """The state to start from, and what was changed in it (in words): see the module."""
    try:
        machine = StateMachine.from_dict(doc["state"])
    except (KeyError, TypeError, ValueError) as e:
        raise BackupError(f"{where}: its state cannot be loaded ({type(e).__name__}: {e}); use another backup") from None
    said = []
    taken = doc.get("created_at")
    for job in list(machine.running_jobs()):
        why = (f"restored from a backup taken at {taken:.0f} while it ran on {', '.join(a.node for a in job.allocations)}"
               if isinstance(taken, (int, float)) else "restored from a backup taken while it ran")
        if job.spec.requeue and len(job.allocations) == 1:
            r = machine.apply(C.command(C.JOB_REQUEUE, job_id=job.id, at=at, attempt=job.attempt,
                                        reason=f"{why}; requeued"))
            said.append(f"job {job.id}: requeued (it ran when the backup was taken)")
        else:
            r = machine.apply(C.command(C.JOB_FINISH, job_id=job.id, at=at, attempt=job.attempt, state="lost",
                                        reason=f"{why}; not requeued ("
                                               + ("requeue=no)" if not job.spec.requeue else "a gang)")))
            said.append(f"job {job.id}: lost (it ran when the backup was taken; "
                        + ("requeue=no)" if not job.spec.requeue else "a gang)"))
        if not r["ok"]:
            raise BackupError(f"{where}: job {job.id} could not be set aside: {r['error']}")
    return machine, said
