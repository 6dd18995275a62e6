"""QM_STORE: memory by default, whatever is installed; a wrong value stops the service with the choices (ADR 0041)."""

from __future__ import annotations

import pytest

from services.adapters.settings import Settings


def test_tables_live_in_memory_unless_asked_otherwise():
    # rocksdict is a dependency, so it is installed: before ADR 0041 that made rocksdb:// the
    # default, the one store no launcher, test or benchmark ran.
    assert Settings.from_env("queue-manager", {}).store == "memory://"
    assert Settings.from_env("queue-manager", {"QM_STORE": "rocksdb://"}).store == "rocksdb://"


def test_an_unknown_store_names_the_choices():
    with pytest.raises(SystemExit, match=r"QM_STORE='rocks://': expected one of memory://, rocksdb://"):
        Settings.from_env("queue-manager", {"QM_STORE": "rocks://"})
