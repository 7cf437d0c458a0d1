"""The PEP 517 build backend of mtgpu-client (pyproject.toml in this folder, `backend-path`).

The client's sources are files of the repository's one mtgpu/ tree (client_modules.txt names
them), outside this project's folder, which setuptools will not package; this backend writes
the wheel (and the sdist) itself with zipfile and tarfile, from the standard library only.

Where the sources are: in a checkout, the repository two folders up (its pyproject.toml gives
the version); in an sdist this backend wrote, beside this file (its PKG-INFO gives the version).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import re
import tarfile
import time
import tomllib
import zipfile
from email.message import EmailMessage
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = "client_modules.txt"
TAG = "py3-none-any"
# zip and tar entries get a fixed time (SOURCE_DATE_EPOCH when set): the same tree, the same archive
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", 315532800))  # 1980-01-01, the first time zip can hold


def read_manifest(path: Path) -> list[str]:
    """The manifest's file paths (relative to the source root, '/'-separated), in its order."""
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def _project() -> dict:
    return tomllib.loads((HERE / "pyproject.toml").read_text())["project"]


def source_root() -> Path:
    """Where mtgpu/ is: beside this file in an sdist, else the repository two folders up."""
    if (HERE / "PKG-INFO").is_file():
        return HERE
    repo = HERE.parent.parent
    try:
        name = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["name"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        raise RuntimeError(f"mtgpu-client builds from a checkout of mtgpu ({repo} is none: {e})") from None
    if name != "mtgpu":
        raise RuntimeError(f"mtgpu-client builds from a checkout of mtgpu ({repo}/pyproject.toml is {name!r}'s)")
    return repo


def version() -> str:
    """The server's version (one version for both distributions)."""
    if (HERE / "PKG-INFO").is_file():
        for line in (HERE / "PKG-INFO").read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
        raise RuntimeError(f"{HERE / 'PKG-INFO'} has no Version")
    return tomllib.loads((source_root() / "pyproject.toml").read_text())["project"]["version"]


def _dist_name() -> str:
    return re.sub(r"[-_.]+", "_", _project()["name"]).lower()


def client_files() -> list[tuple[str, Path]]:
    """(path in the wheel, file on disk) for each file the manifest names; a missing one is an error."""
    root = source_root()
    out = []
    for rel in read_manifest(HERE / MANIFEST):
        path = root / rel
        if not path.is_file():
            raise RuntimeError(f"{MANIFEST} names {rel}, which {root} does not hold")
        out.append((rel, path))
    return out


def metadata_text() -> str:
    p = _project()
    m = EmailMessage()
    m["Metadata-Version"] = "2.1"
    m["Name"] = p["name"]
    m["Version"] = version()
    m["Summary"] = p["description"]
    m["License"] = p["license"]
    m["Requires-Python"] = p["requires-python"]
    for dep in p.get("dependencies", []):
        m["Requires-Dist"] = dep
    readme = HERE / p["readme"]
    m["Description-Content-Type"] = "text/markdown"
    m.set_payload(readme.read_text())
    return m.as_string(policy=m.policy.clone(max_line_length=0))


def entry_points_text() -> str:
    scripts = _project().get("scripts", {})
    return "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())


def _wheel_text() -> str:
    return f"Wheel-Version: 1.0\nGenerator: mtgpu_client_build\nRoot-Is-Purelib: true\nTag: {TAG}\n"


def _dist_info() -> str:
    return f"{_dist_name()}-{version()}.dist-info"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: list[tuple[str, bytes]]) -> str:
    """files: (path in the wheel, content), the dist-info's added here; RECORD last."""
    info = _dist_info()
    files = files + [(f"{info}/METADATA", metadata_text().encode()), (f"{info}/WHEEL", _wheel_text().encode()),
                     (f"{info}/entry_points.txt", entry_points_text().encode())]
    record = [_record_line(n, d) for n, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    name = f"{_dist_name()}-{version()}-{TAG}.whl"
    target = Path(wheel_directory) / name
    tmp = target.with_name(name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            entry = zipfile.ZipInfo(path, _zip_time())
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    os.replace(tmp, target)
    return name


def _zip_time() -> tuple[int, int, int, int, int, int]:
    t = time.gmtime(max(EPOCH, 315532800))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec - t.tm_sec % 2)


# ---------------------------------------------------------------- PEP 517 / PEP 660 hooks


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings=None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings=None) -> str:
    info = Path(metadata_directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(metadata_text())
    (info / "WHEEL").write_text(_wheel_text())
    (info / "entry_points.txt").write_text(entry_points_text())
    return info.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings=None, metadata_directory=None) -> str:
    return _write_wheel(wheel_directory, [(rel, path.read_bytes()) for rel, path in client_files()])


def build_editable(wheel_directory: str, config_settings=None, metadata_directory=None) -> str:
    """A wheel whose .pth puts the checkout on sys.path: its mtgpu/ is imported where it is
    (the whole tree; `pip install -e .` of the server maps the same folder)."""
    root = source_root()
    client_files()  # the manifest holds, as for a real wheel
    return _write_wheel(wheel_directory, [(f"__editable__.{_dist_name()}.pth", f"{root}\n".encode())])


def build_sdist(sdist_directory: str, config_settings=None) -> str:
    """pyproject.toml, this backend, the manifest, the README, PKG-INFO and the client's files of
    mtgpu/: what build_wheel needs to build the same wheel from the unpacked sdist."""
    base = f"{_dist_name()}-{version()}"
    members = [(name, (HERE / name).read_bytes()) for name in ("pyproject.toml", Path(__file__).name, MANIFEST,
                                                                  _project()["readme"])]
    members.append(("PKG-INFO", metadata_text().encode()))
    members += [(rel, path.read_bytes()) for rel, path in client_files()]
    name = f"{base}.tar.gz"
    target = Path(sdist_directory) / name
    tmp = target.with_name(name + ".part")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=EPOCH) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, data in members:
            entry = tarfile.TarInfo(f"{base}/{rel}")
            entry.size, entry.mode, entry.mtime = len(data), 0o644, EPOCH
            tar.addfile(entry, io.BytesIO(data))
    os.replace(tmp, target)
    return name
