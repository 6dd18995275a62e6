"""`python -m services.sim`: the simulator on its own, as docker-compose.yml runs it."""

from __future__ import annotations

import pytest

from services.adapters.kueue_config import KueueConfig
from services.cost_accounting.config import load_config
from services.sim import __main__ as sim_main
from services.sim.config import cluster_queue_name
from services.trace.alibaba import TEAM_NAMESPACES


def test_config_is_what_the_services_load(tmp_path):
    assert sim_main.main(["config", str(tmp_path)]) == 0
    queues = KueueConfig.load(tmp_path).objects.cluster_queues
    assert {cluster_queue_name(ns) for ns in TEAM_NAMESPACES} <= set(queues)
    assert load_config(tmp_path).price_list is not None  # the seed price list, as `qm demo` gives it


@pytest.fixture
def simulated(monkeypatch):
    calls = []

    async def run_simulation(bootstrap, prefix, **options):
        calls.append({"bootstrap": bootstrap, "prefix": prefix, **options})

    monkeypatch.setattr(sim_main, "run_simulation", run_simulation)
    for name in ("QM_KAFKA_BOOTSTRAP", "QM_TOPIC_PREFIX", "TRACE"):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_run_has_the_demo_defaults(simulated):
    assert sim_main.main(["run"]) == 0
    [call] = simulated
    assert (call["bootstrap"], call["prefix"], call["speed"], call["duration_s"]) == ("127.0.0.1:9092", "", 600.0, 4 * 3600)
    assert len(call["trace"]) == 400  # generated pods, spread over the duration


def test_run_options_and_environment(simulated, monkeypatch):
    monkeypatch.setenv("QM_KAFKA_BOOTSTRAP", "kafka:29092")
    sim_main.main(["run", "--speed", "60", "--duration", "0.5", "--pods", "7", "--trace", "pods.csv"])
    [call] = simulated
    assert (call["bootstrap"], call["speed"], call["duration_s"], call["trace"]) == ("kafka:29092", 60.0, 1800.0, "pods.csv")


def test_abbreviated_options_are_refused():
    with pytest.raises(SystemExit):
        sim_main.parser().parse_args(["run", "--pod", "3"])
