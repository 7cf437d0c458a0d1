"""JSON with comments, as VS Code reads devcontainer.json: `//` and `/* */` comments and
trailing commas before `}` or `]` are allowed; anything else must be strict JSON.

The reference reader (Microsoft's jsonc-parser) also tolerates broken JSON and guesses;
we refuse it with the line and column instead, so a typo never becomes a silently
missing key."""

from __future__ import annotations

import json
from typing import Any


class JsoncError(ValueError):
    """Text that is not JSON with comments: `where` is "line L column C" (or "the file"),
    `problem` what is wrong there."""

    def __init__(self, where: str, problem: str):
        self.where = where
        self.problem = problem
        super().__init__(f"{where}: {problem}")


def _blank(chars: list[str], start: int, end: int) -> None:
    for i in range(start, end):
        if chars[i] != "\n":
            chars[i] = " "


def strip_jsonc(text: str) -> str:
    """Return `text` with comments and trailing commas blanked out by spaces, so that
    every line and column a JSON error names is still the one in the file."""
    chars = list(text)
    n = len(chars)
    i = 0
    last_comma: int | None = None  # the last comma outside a string, while only blanks follow it
    previous = ""  # the last character outside comments and blanks
    while i < n:
        c = chars[i]
        if c == '"':
            last_comma, previous = None, c
            i += 1
            while i < n and chars[i] != '"':
                i += 2 if chars[i] == "\\" else 1
            i += 1
        elif c == "/" and i + 1 < n and chars[i + 1] == "/":
            end = text.find("\n", i)
            end = n if end < 0 else end
            _blank(chars, i, end)
            i = end
        elif c == "/" and i + 1 < n and chars[i + 1] == "*":
            end = text.find("*/", i + 2)
            if end < 0:
                line = text.count("\n", 0, i) + 1
                raise JsoncError(f"line {line}", "a /* comment is never closed; end it with */")
            _blank(chars, i, end + 2)
            i = end + 2
        elif c in "}]" and last_comma is not None:
            chars[last_comma] = " "
            last_comma, previous = None, c
            i += 1
        elif c == ",":
            # only a comma after a value can be trailing; `[,]` or `1,,]` stays an error
            last_comma = i if previous not in ("", ",", "[", "{") else None
            previous = c
            i += 1
        else:
            if not c.isspace():
                last_comma, previous = None, c
            i += 1
    return "".join(chars)


def _refuse_constant(name: str) -> Any:
    raise JsoncError("the file", f"{name} is not JSON; write a number or a string")


def loads_jsonc(text: str) -> Any:
    """Parse JSON with comments and trailing commas (a leading byte-order mark is skipped)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    stripped = strip_jsonc(text)
    if not stripped.strip():
        raise JsoncError("the file", 'is empty; write a JSON object such as {"image": "..."}')
    try:
        return json.loads(stripped, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise JsoncError(f"line {e.lineno} column {e.colno}", e.msg) from None
