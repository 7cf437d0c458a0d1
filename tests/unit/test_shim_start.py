"""The job shim starts without importing json (its start is the job's: shim.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mtgpu.agent.runners import shim
from mtgpu.agent.runners.native import SHIM_PATH


@pytest.mark.parametrize("record", [
    {"pid": 4242, "starttime": 123456789, "started_at": 1764748800.123456, "boot": "0f1e2d3c-aaaa-bbbb-cccc-000000000001"},
    {"exit_code": 0, "signal": None, "ended_at": 1.5, "reason": "", "fenced": False},
    {"exit_code": None, "signal": 9, "ended_at": 2.0, "reason": 'said "no" \\ twice\nthen é', "fenced": True},
    {"reason": "x" * 10, "n": float("inf")},
    {"nested": {"a": [1, 2]}},
])
def test_records_read_back_as_json_writes_them(record):
    text = shim._dumps(record)
    if record.get("n") == float("inf"):
        assert text == json.dumps(record)  # not finite: json's own spelling
    else:
        assert json.loads(text) == record


def test_the_shim_module_loads_without_json_and_started_json_needs_none():
    code = ("import sys, runpy; sys.argv = ['shim']; g = runpy.run_path(%r, run_name='not_main'); "
            "g['_dumps']({'pid': 1, 'starttime': 2, 'started_at': 3.5, 'boot': 'b'}); "
            "print('json' in sys.modules)") % SHIM_PATH
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_shim_becomes_a_subreaper_without_the_ctypes_or_signal_packages():
    """ctypes and signal (enum) took some ms of every job's start (issue 28 target 3): the
    shim uses _ctypes and _signal, and orphans of the job are still re-parented to it."""
    code = ("import sys, os, time; sys.argv = ['shim']; g = {'__name__': 'not_main'}; p = %r; "
            "exec(compile(open(p).read(), p, 'exec'), g); g['_set_subreaper']()\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(0.5); os._exit(7)\n"
            "    os._exit(0)\n"
            "os.waitpid(child, 0)\n"
            "pid, status = os.waitpid(-1, 0)\n"
            "print(pid != child, os.waitstatus_to_exitcode(status), sorted({'ctypes', 'signal', 'enum'} & set(sys.modules)))"
            ) % SHIM_PATH
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    assert out.stdout.strip() == "True 7 []", out.stdout + out.stderr
