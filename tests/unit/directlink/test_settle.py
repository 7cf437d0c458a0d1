"""How long a command waits for the direct path before it says which path it took
(Tunnel.settle): a fixed 2 s left every command of a loaded CI run on the relay although
the direct path came up each time a little later; the wait now scales with how long the
dial itself took (a loaded peer or machine shows in it), within bounds."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from mtgpu.client.directlink import Tunnel


def tunnel_whose_direct_path_comes_after(seconds: float, dial_s: float, public: str | None = "198.51.100.7:4000"):
    t = Tunnel({}, None, "gpu-a")
    t._endpoint = SimpleNamespace(udp=object(), public=public)
    t.session = SimpleNamespace(path="relay")
    t.dial_s = dial_s
    timer = threading.Timer(seconds, lambda: setattr(t.session, "path", "direct"))
    timer.daemon = True
    timer.start()
    return t, timer


def test_a_slow_dial_gives_the_direct_path_longer_than_two_seconds():
    t, timer = tunnel_whose_direct_path_comes_after(3.0, dial_s=2.5)  # 4 x 2.5 s -> 10 s at most
    try:
        assert t.settle() == "direct" and t.label == "p2p"
    finally:
        timer.cancel()


def test_a_quick_dial_still_waits_two_seconds_and_no_longer_than_its_bound():
    t, timer = tunnel_whose_direct_path_comes_after(30.0, dial_s=0.01)
    try:
        began = time.monotonic()
        assert t.settle() == "relay"
        took = time.monotonic() - began
        assert 2.0 <= took < 25.0, took  # the lower bound holds; the 10 s bound, far below the path's 30 s
    finally:
        timer.cancel()


def test_an_endpoint_without_a_public_address_does_not_wait():
    t, timer = tunnel_whose_direct_path_comes_after(30.0, dial_s=2.5, public=None)
    try:
        began = time.monotonic()
        assert t.settle() == "relay" and time.monotonic() - began < 1.5
    finally:
        timer.cancel()
