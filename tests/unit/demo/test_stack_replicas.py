"""QM_REPLICAS: more than one process of a service in the local stack (bench and demo)."""

from __future__ import annotations

import pytest

from services.demo import stack


def test_each_service_runs_once_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("QM_REPLICAS", raising=False)
    s = stack.Stack(tmp_path, {}, base_port=20_000)
    assert s.instances() == [(service, service) for service in stack.SERVICES]
    assert [s.port(service) for service in stack.SERVICES] == [20_000, 20_001, 20_002, 20_003]


def test_replicas_get_a_name_a_port_and_a_store_of_their_own(tmp_path, monkeypatch):
    monkeypatch.setenv("QM_REPLICAS", "admission=3")
    started = []
    monkeypatch.setattr(stack.subprocess, "Popen", lambda args, **kw: started.append(kw["env"]) or object())
    s = stack.Stack(tmp_path, {"QM_DATA_DIR": "/tmp/qm-data"}, base_port=stack.free_base_port(6))
    s.start()
    names = [name for name, _ in s.instances()]
    assert names == [*stack.SERVICES, "admission-2", "admission-3"]
    assert len({env["QM_WEB_PORT"] for env in started}) == 6
    data_dirs = [env["QM_DATA_DIR"] for env in started]
    assert data_dirs[:4] == ["/tmp/qm-data"] * 4
    assert data_dirs[4:] == ["/tmp/qm-data/admission-2", "/tmp/qm-data/admission-3"]
    assert set(s.processes) == set(names)


@pytest.mark.parametrize("raw", ["admision=2", "admission=0", "admission=two", "admission"])
def test_a_wrong_replica_count_names_what_is_expected(raw):
    with pytest.raises(SystemExit, match="SERVICE=COUNT"):
        stack.replicas_from_env(raw)


def test_several_services_may_be_replicated():
    assert stack.replicas_from_env("admission=2, queue-manager=2") == {"admission": 2, "queue-manager": 2}
