"""QM_PRODUCER_LINGER_MS: how long the services' producer waits to share a request among records
sent close together (ADR 0037). By default it sends each at once, as faust does."""

from __future__ import annotations

import os
import uuid

import pytest

from services.adapters.runtime import PRODUCER_LINGER_MS, ServiceRuntime, producer_linger_ms
from services.adapters.settings import Settings


def test_the_producer_the_runtime_builds_lingers_as_configured():
    runtime = ServiceRuntime(Settings(service="linger-test", app_id_suffix=f"-{uuid.uuid4().hex[:6]}"))
    assert runtime.app.producer.linger_ms == PRODUCER_LINGER_MS
    assert runtime.app.producer._settings_default()["linger_ms"] == PRODUCER_LINGER_MS  # what aiokafka gets


@pytest.mark.skipif("QM_PRODUCER_LINGER_MS" in os.environ, reason="the suite runs with QM_PRODUCER_LINGER_MS set")
def test_by_default_every_record_is_sent_at_once():
    assert PRODUCER_LINGER_MS == 0


@pytest.mark.parametrize("raw", ["-1", "2.5", "fast", "", "1001"])
def test_a_linger_that_is_not_whole_milliseconds_stops_the_service_naming_the_setting(raw):
    with pytest.raises(SystemExit, match=r"QM_PRODUCER_LINGER_MS=.*whole milliseconds from 0 to 1000"):
        producer_linger_ms(raw)


def test_zero_sends_at_once_and_unset_is_the_default():
    assert producer_linger_ms("0") == 0 and producer_linger_ms(None) == 0 and producer_linger_ms(" 5 ") == 5
