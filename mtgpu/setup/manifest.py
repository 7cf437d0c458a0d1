"""What an install did, kept in /etc/mtgpu/install.json for `status` and `uninstall`: the
service path chosen, the environment (and whether the install made it), the config."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from .plan import Check

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class Manifest:
    format: int
    config: str
    venv: str
    venv_created: bool  # uninstall removes the environment only when the install made it
    service: str  # "systemd" or "init.d"
    boot_hook: str
    definition: str  # the unit or the init script

    def text(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def read_manifest(path: Path) -> Manifest | None:
    try:
        doc = json.loads(path.read_text())
        return Manifest(**{k: doc[k] for k in Manifest.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


class ManifestStep:
    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest

    def check(self) -> Check:
        try:
            same = self.path.read_text() == self.manifest.text()
        except OSError:
            same = False
        return Check(same, str(self.path) if same else "")

    def apply(self) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(self.manifest.text())
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)
        return f"recorded in {self.path}"
