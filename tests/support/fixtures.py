"""pytest fixtures over tests.support; import them into a conftest.py:

    from tests.support.fixtures import temp_user_factory, tenant  # noqa: F401

`tenant` is one fresh user per test; `temp_user_factory(prefix="mtt")` makes as many
as a test needs. All are removed at teardown, also when the test fails. Tests are
skipped (with the reason) where users cannot be created (not root, no useradd).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import pytest

from tests.support.users import TempUser, can_create_users, temp_user


@pytest.fixture
def temp_user_factory() -> Iterator[Callable[..., TempUser]]:
    why = can_create_users()
    if why:
        pytest.skip(why)
    with contextlib.ExitStack() as stack:
        def make(prefix: str = "mtt") -> TempUser:
            return stack.enter_context(temp_user(prefix))

        yield make


@pytest.fixture
def tenant(temp_user_factory) -> TempUser:
    return temp_user_factory("mtt")
