"""Scratch folders for tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def traversable_folder(prefix: str = "mtgpu-test-") -> Iterator[Path]:
    """A scratch folder others (tenants) can walk through (mode 0755; pytest's tmp_path is
    not), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
