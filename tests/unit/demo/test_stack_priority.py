"""On one machine the local stack runs the cost service (and, when told, admission) at a lower CPU
priority than the queue-manager (ADR 0022, ADR 0029), on web ports nothing else takes meanwhile."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from services.demo.stack import SERVICES, _ephemeral_ports, free_base_port, lowered_priority, service_nice

NICENESS = [sys.executable, "-c", "import os; print(os.nice(0))"]


def test_the_cost_service_gives_way_by_ten_and_admission_only_when_told(monkeypatch):
    monkeypatch.delenv("QM_COST_NICE", raising=False)
    monkeypatch.delenv("QM_ADMISSION_NICE", raising=False)
    assert {s: service_nice(s) for s in SERVICES} == {
        "admission": 0, "queue-manager": 0, "preemption": 0, "cost-accounting": 10}
    monkeypatch.setenv("QM_COST_NICE", "0")
    monkeypatch.setenv("QM_ADMISSION_NICE", "5")
    assert {s: service_nice(s) for s in SERVICES} == {
        "admission": 5, "queue-manager": 0, "preemption": 0, "cost-accounting": 0}


@pytest.mark.parametrize("variable, service", [("QM_COST_NICE", "cost-accounting"), ("QM_ADMISSION_NICE", "admission")])
@pytest.mark.parametrize("raw", ["ten", "-5", "20"])
def test_a_bad_niceness_stops_the_stack_and_says_what_is_expected(monkeypatch, variable, service, raw):
    monkeypatch.setenv(variable, raw)
    with pytest.raises(SystemExit, match=rf"{variable}=.*expected a niceness from 0 to 19"):
        service_nice(service)


def test_a_process_started_with_a_lowered_priority_runs_that_much_nicer():
    base = os.nice(0)
    lowered = subprocess.run(NICENESS, preexec_fn=lowered_priority(5), capture_output=True, text=True, check=True)
    same = subprocess.run(NICENESS, preexec_fn=lowered_priority(0), capture_output=True, text=True, check=True)
    assert int(lowered.stdout) == min(base + 5, 19)
    assert int(same.stdout) == base


def test_service_ports_are_chosen_outside_the_range_of_outgoing_connections():
    """A port from the kernel's ephemeral range can become an outgoing connection's local port
    before the service binds it (CI once: "address already in use")."""
    low, _ = _ephemeral_ports()
    base = free_base_port()
    assert 10_000 <= base and base + len(SERVICES) <= low
    with socket.socket() as taken:  # and the run it picks is free
        taken.bind(("127.0.0.1", base))
