"""What every client raises: the node's own error message, or why it could not be reached."""

from __future__ import annotations

from typing import Any

import httpx

from ..model.api import STALE_HEADER


def stale_warning(r: httpx.Response) -> None:
    """Print the member's warning once per message when its answer may be out of date."""
    why = r.headers.get(STALE_HEADER)
    if why and why not in _warned:
        _warned.add(why)
        import sys

        sys.stderr.write(f"warning: {why}\n")


_warned: set[str] = set()


class ClientError(Exception):
    """The node answered with an error, or could not be reached; the message says which."""

    def __init__(self, message: str, status: int = 0, refused: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.refused = refused


def answer(r: httpx.Response) -> Any:
    """The JSON body of a node's answer, or ClientError with the node's own message."""
    stale_warning(r)
    if r.status_code >= 400:
        try:
            body = r.json()
        except ValueError:
            body = {"error": r.text}
        msg = body.get("error") or body.get("detail") or r.text
        raise ClientError(str(msg), status=r.status_code, refused=bool(body.get("refused")))
    return r.json()
