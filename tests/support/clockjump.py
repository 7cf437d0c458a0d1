"""One member's wall clock set forward or back (tests/support/clockjump.c), for the
clock-jump tests: `ClockJump.prefix()` goes before the member's command line, and
`jump(seconds)` moves that member's wall clock from then on."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("clockjump.c")


def missing() -> str | None:
    """Why the library cannot be built here, or None."""
    return None if shutil.which("gcc") else "gcc is not installed (scripts/install.sh installs it)"


class ClockJump:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mtgpu-clockjump-"))
        self.library = self.dir / "libclockjump.so"
        r = subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(self.library),
                            str(SOURCE), "-ldl"], capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise RuntimeError(f"building {SOURCE.name} failed: {r.stderr}")
        self.dir.chmod(0o755)  # the member's jobs (tenants) load it too
        self.offset_file = self.dir / "offset"
        self.jump(0)

    def prefix(self) -> list[str]:
        return ["env", f"LD_PRELOAD={self.library}", f"MTGPU_TEST_CLOCK_FILE={self.offset_file}"]

    def jump(self, seconds: float) -> None:
        """The member's wall clock reads the machine's plus `seconds` (within 0.1 s)."""
        tmp = self.offset_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds}\n")
        tmp.chmod(0o644)
        tmp.replace(self.offset_file)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
