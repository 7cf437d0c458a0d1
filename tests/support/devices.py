"""A child process that opens device nodes once its caller has placed it (in a cgroup,
a namespace): what the device-fence tests share. It reads one line from stdin, then
prints {path: "opened" or the errno's name} as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

OPENER = r"""
import errno, json, os, sys
sys.stdin.readline()  # placed in its cgroup by now
out = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        out[path] = "opened"
    except OSError as e:
        out[path] = errno.errorcode[e.errno]
print(json.dumps(out), flush=True)
"""


def start_opener(*paths: str) -> subprocess.Popen:
    """The child, waiting to be placed; kill it if the test fails before opened()."""
    return subprocess.Popen([sys.executable, "-I", "-c", OPENER, *paths], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def opened(child: subprocess.Popen, timeout_s: float = 120.0) -> dict[str, str]:
    """Let the placed child open its paths; what each gave."""
    out, _ = child.communicate("go\n", timeout=timeout_s)
    assert child.returncode == 0, out
    return json.loads(out)
