"""A write refused by a full disk is known by its file even when the error raised last
(the file's close failing too) names none (server/member/runtime._filename_of)."""

from __future__ import annotations

import errno

from mtgpu.server.member.runtime import _filename_of


def test_the_file_comes_from_the_error_the_last_one_happened_in_the_handling_of():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/var/lib/mtgpu/lease.tmp")
        except OSError:
            raise OSError(errno.ENOSPC, "No space left on device")  # the close: no file
    except OSError as e:
        assert e.filename is None and _filename_of(e) == "/var/lib/mtgpu/lease.tmp"
    assert _filename_of(OSError(errno.ENOSPC, "full")) == ""
    assert _filename_of(OSError(errno.ENOSPC, "full", "/x")) == "/x"
