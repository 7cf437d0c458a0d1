"""Fixtures every integration test may use: real temporary Linux users (module-wide
`alice` and `bob`, one fresh `tenant` per test, or as many as a test asks for), and a
world-traversable scratch folder. Everything is removed at teardown, also when the test
fails. Every test in this folder is marked `integration`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.support.fixtures import temp_user_factory, tenant  # noqa: F401 (fixtures)
from tests.support.folders import traversable_folder
from tests.support.users import TempUser, can_create_users, sweep_leftover_accounts, temp_user


def pytest_collection_modifyitems(config, items) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session", autouse=True)
def _no_accounts_left_by_a_killed_run() -> None:
    """A run killed earlier (SIGKILL skips teardown) can leave tenant accounts whose uids a
    test is about to allocate again; remove those first (only ones whose folder is gone)."""
    if can_create_users() is None:
        sweep_leftover_accounts()


def _module_user(prefix: str) -> Iterator[TempUser]:
    why = can_create_users()
    if why:
        pytest.skip(why)
    with temp_user(prefix) as u:
        yield u


@pytest.fixture(scope="module")
def alice() -> Iterator[TempUser]:
    """A tenant shared by the tests of one module."""
    yield from _module_user("mta")


@pytest.fixture(scope="module")
def bob() -> Iterator[TempUser]:
    """A second tenant shared by the tests of one module."""
    yield from _module_user("mtb")


@pytest.fixture
def base() -> Iterator[Path]:
    """A scratch folder tenants can traverse (mode 0755), removed afterwards."""
    with traversable_folder("mtgpu-test-") as d:
        yield d
