"""The invitation `remotegpu-cli join` takes: read back whole, a damaged one refused with
what to do, a bare code left to --server; its key derives from the code's hash alone."""

from __future__ import annotations

import base64
import json

import pytest

from mtgpu.client.directlink import INVITATION_PREFIX, parse_invitation
from mtgpu.client.errors import ClientError
from mtgpu.directlink.identity import endpoint_id, invite_code_hash, invite_id, invite_key


def invitation(doc: dict) -> str:
    return INVITATION_PREFIX + base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def test_an_invitation_is_read_back_and_a_bare_code_is_none():
    doc = {"v": 1, "code": "ab" * 16, "server": "10.0.0.2:7070", "node": "gpu-a", "cluster_id": "lab"}
    assert parse_invitation(invitation(doc)) == doc
    assert parse_invitation("  " + invitation(doc) + "\n") == doc
    assert parse_invitation("ab" * 16) is None


@pytest.mark.parametrize("text", [INVITATION_PREFIX + "not-base64-json!",
                                  invitation({"code": "x"}), invitation({"server": "h:1"})])
def test_a_damaged_invitation_is_refused_saying_what_to_do(text):
    with pytest.raises(ClientError, match="copy it whole.*--server"):
        parse_invitation(text)


def test_the_invitation_key_derives_from_the_code_hash_the_members_hold():
    h = invite_code_hash("ab" * 16)
    assert h == invite_code_hash(" " + "ab" * 16 + "\n")  # as typed
    assert endpoint_id(invite_key(h)) == invite_id(h) != invite_id(invite_code_hash("cd" * 16))
