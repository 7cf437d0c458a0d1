"""Windows and macOS: nothing on the client's path (remotegpu-cli, the terminal app, the
clients they use) may import a Linux- or POSIX-only module. Checked by importing them in
an interpreter where fcntl, pwd, grp and resource cannot be imported."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = ("fcntl", "pwd", "grp", "resource")
CLIENT_PATH = ("mtgpu.cli.remotegpu", "mtgpu.tui.app", "mtgpu.tui.rows", "mtgpu.tui.source", "mtgpu.client.remote",
               "mtgpu.client.directlink", "mtgpu.client.sshconfig", "mtgpu.client.logs")

PROBE = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in {BLOCKED!r}:
            raise ImportError(f"{{name}} does not exist on Windows")
for name in {BLOCKED!r}:
    sys.modules.pop(name, None)
sys.meta_path.insert(0, Block())
for module in {CLIENT_PATH!r}:
    importlib.import_module(module)
print("ok")
"""


def test_the_client_path_imports_without_linux_only_modules():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
