"""Checksums of what the state keeps on disk: every journal line, Raft entry and snapshot.

A changed byte in a journal used to be replayed as if it had been written so (a flipped
bit in a job's script, uid or node). Everything written now carries a CRC-32 (zlib's,
in C: a fraction of a microsecond per entry, no extra write or fsync) and is checked
when the node starts; a mismatch stops the start, naming the file and the entry.

Two forms, one idea:
- The standalone journal and snapshot are JSON text: the checksum covers the exact
  bytes. A line `{"seq":...}` is written as `{"crc":"<8 hex>","seq":...}`: the crc field
  is inserted at the front, and the checksum is that of the line without it (the line
  an older version wrote, byte for byte). The file stays one JSON document per line.
- Raft entries and snapshots are pickled by pysyncobj: the command dict handed to it
  carries `crc`, the checksum of the command's JSON text (`{"cmd":...,"args":...}`, in
  the dict's own key order, which pickling keeps). Read back, the dict is encoded the
  same way and compared, so any change of what the entry means is seen. A member of an
  older version applies such an entry as before (the machine reads `cmd` and `args`).

Entries an older version wrote have no checksum ("legacy"). They are told apart by their
first bytes, which a flipped bit cannot produce from a checksummed entry: a checksummed
line starts with `{"crc":"`, a legacy one with `{"seq":`; anything shaped like the
former with a damaged name or value is refused, never read as legacy.
"""

from __future__ import annotations

import json
import re
import zlib

_LINE_MARK = b'{"crc":"'
_MARK_END = len(_LINE_MARK) + 8  # the 8 hex digits
_LEGACY_LINE = b'{"seq":'
# What a checksummed line's or snapshot's head looks like with one of its bytes changed:
# a three-letter name and an eight-character value. Such a head is damage, not a legacy entry.
_MARK_SHAPE = re.compile(rb'\{"[^"]{3}":"[^"]{8}"')

COMMAND_KEYS = ("cmd", "args")
CRC_KEY = "crc"


class ChecksumMismatch(ValueError):
    """A checksummed entry whose bytes are not those it was written with."""


def crc_hex(data: bytes) -> str:
    return f"{zlib.crc32(data):08x}"


# ------------------------------------------------------------------ JSON text (standalone)
def seal_json(body: bytes) -> bytes:
    """`body` (a JSON object's text, `{...}`) with its checksum as the first field."""
    return b'{"crc":"%08x",' % zlib.crc32(body) + body[1:]


def open_json(data: bytes) -> tuple[bytes, bool]:
    """(the text that was checksummed, True) for a sealed object; (data, False) for one an
    older version wrote without a checksum. Raises ChecksumMismatch when the checksum
    does not match, or when the head is a checksum's head with a byte changed."""
    if data.startswith(_LINE_MARK):
        if data[_MARK_END:_MARK_END + 2] != b'",':
            raise ChecksumMismatch("its checksum field is damaged")
        body = b"{" + data[_MARK_END + 2:]
        want = data[len(_LINE_MARK):_MARK_END]
        got = crc_hex(body).encode()
        if want != got:
            raise ChecksumMismatch(f"its checksum ({want.decode(errors='replace')}) is not that of its bytes "
                                   f"({got.decode()})")
        return body, True
    if _MARK_SHAPE.match(data):
        raise ChecksumMismatch("its checksum field is damaged")
    return data, False


def is_legacy_line(line: bytes) -> bool:
    """Whether `line` has the head of the lines older versions wrote (`{"seq":`)."""
    return line.startswith(_LEGACY_LINE)


# ------------------------------------------------------------------ commands (Raft)
def _command_text(command: dict) -> bytes:
    return json.dumps({k: v for k, v in command.items() if k != CRC_KEY}, separators=(",", ":")).encode()


def seal_command(command: dict) -> dict:
    """A copy of `command` carrying the checksum of its JSON text (what goes into the Raft log)."""
    return {**command, CRC_KEY: crc_hex(_command_text(command))}


def command_problem(command: object) -> str | None:
    """Why a command read back from the Raft log cannot be trusted, or None (a legacy
    command, without a checksum, is accepted when it has exactly the keys one has)."""
    if not isinstance(command, dict):
        return f"holds a {type(command).__name__} where a command belongs"
    keys = set(command)
    if CRC_KEY not in command:
        if keys != set(COMMAND_KEYS):
            return f"holds a command with the fields {sorted(keys)} (a checksum's field damaged?)"
        return None
    if keys != {*COMMAND_KEYS, CRC_KEY}:
        return f"holds a command with the fields {sorted(keys)}"
    try:
        got = crc_hex(_command_text(command))
    except (TypeError, ValueError) as e:
        return f"holds a command that cannot be encoded to check it ({type(e).__name__})"
    if command[CRC_KEY] != got:
        return f"whose checksum ({str(command[CRC_KEY])[:16]}) is not that of its command ({got})"
    return None


def unsealed(command: dict) -> dict:
    """The command without its checksum (what the state machine applies)."""
    if CRC_KEY not in command:
        return command
    return {k: v for k, v in command.items() if k != CRC_KEY}


# ------------------------------------------------------------------ Raft snapshots
MACHINE_CRC_KEY = "machine_crc32"


def seal_state(state: dict) -> dict:
    """The consumer's snapshot dict ({"format", "machine"}) with the machine's checksum."""
    return {**state, MACHINE_CRC_KEY: crc_hex(json.dumps(state["machine"], separators=(",", ":")).encode())}


def state_problem(state: object) -> str | None:
    """Why the state in a Raft snapshot cannot be trusted, or None (legacy: no checksum)."""
    if not isinstance(state, dict) or not isinstance(state.get("machine"), dict):
        return "does not hold mtgpu's state"
    extra = set(state) - {"format", "machine", MACHINE_CRC_KEY}
    if extra:
        return f"holds the state with unknown fields {sorted(extra)} (a checksum's field damaged?)"
    if MACHINE_CRC_KEY not in state:
        return None
    try:
        got = crc_hex(json.dumps(state["machine"], separators=(",", ":")).encode())
    except (TypeError, ValueError) as e:
        return f"holds a state that cannot be encoded to check it ({type(e).__name__})"
    if state[MACHINE_CRC_KEY] != got:
        return f"holds a state whose checksum ({str(state[MACHINE_CRC_KEY])[:16]}) is not that of its contents ({got})"
    return None
