"""Where an install puts things. Every path hangs off `root` ("/" on a real machine; a
folder in tests, or for preparing an image), so `--root DIR` moves all of them at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SERVICE_NAME = "mtgpu"
DEFAULT_VENV = "/opt/mtgpu/venv"
DEFAULT_CONFIG = "/etc/mtgpu/mtgpu.toml"
RUNLEVELS_START = ("2", "3", "4", "5")
RUNLEVELS_STOP = ("0", "1", "6")


@dataclass(frozen=True)
class Layout:
    """The install's paths under `root`; `config` and `venv` may be given elsewhere."""

    root: Path
    config: Path
    venv: Path

    @classmethod
    def make(cls, root: Path | str = "/", config: Path | str | None = None, venv: Path | str | None = None) -> "Layout":
        root = Path(root)
        base = cls(root, Path("/"), Path("/"))
        return cls(root,
                   Path(config) if config is not None else base.under(DEFAULT_CONFIG),
                   Path(venv) if venv is not None else base.under(DEFAULT_VENV))

    def under(self, absolute: str) -> Path:
        """`absolute` ("/etc/mtgpu") inside this layout's root."""
        return self.root / absolute.lstrip("/")

    @property
    def prefixed(self) -> bool:
        """True when the install goes into a folder rather than onto this machine's own /."""
        return self.root != Path("/")

    @property
    def etc_dir(self) -> Path:
        return self.under("/etc/mtgpu")

    @property
    def manifest(self) -> Path:
        """What an install did, for status and uninstall (kept beside the config)."""
        return self.under("/etc/mtgpu/install.json")

    @property
    def init_script(self) -> Path:
        return self.under(f"/etc/init.d/{SERVICE_NAME}")

    @property
    def unit(self) -> Path:
        return self.under(f"/etc/systemd/system/{SERVICE_NAME}.service")

    @property
    def pidfile(self) -> Path:
        return self.under(f"/run/{SERVICE_NAME}.pid")

    @property
    def log_dir(self) -> Path:
        return self.under("/var/log/mtgpu")

    @property
    def log_file(self) -> Path:
        return self.log_dir / "server.log"

    @property
    def bin_dir(self) -> Path:
        return self.under("/usr/local/bin")

    @property
    def wsl_conf(self) -> Path:
        return self.under("/etc/wsl.conf")

    def rc_dir(self, level: str) -> Path:
        return self.under(f"/etc/rc{level}.d")

    @property
    def default_state_dir(self) -> Path:
        return self.under("/var/lib/mtgpu")

    @property
    def default_home_root(self) -> Path:
        return self.under("/home/mtgpu")

    @property
    def server(self) -> Path:
        return self.venv / "bin" / "mtgpu-server"
