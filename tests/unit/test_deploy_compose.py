"""docker-compose.yml, Prometheus and Grafana checked against the code.

No Docker engine runs here, so nothing starts these files; this test is what keeps them true:
the services compose runs are the ones `qm demo` runs, with the same command and settings;
Prometheus scrapes each on the port its environment gives it; the dashboard only asks for
metrics the services define; Grafana's provisioning points at files that exist.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

from services.adapters.settings import Settings
from services.demo import stack
from services.sim.__main__ import parser as sim_parser

REPO = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
PROMETHEUS = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
GRAFANA = REPO / "deploy/grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))

# Set per run by `qm demo` so runs can share one broker; compose has a broker of its own.
PER_RUN_SETTINGS = {"QM_TOPIC_PREFIX", "QM_APP_ID_SUFFIX"}
# Series Prometheus makes itself, not the services.
PROMETHEUS_SERIES = {"up"}


def qm_services() -> dict[str, dict]:
    """Compose services running a Quartermaster service: `python -m services.<name> worker …`."""
    return {name: svc for name, svc in COMPOSE.items()
            if svc.get("command", [])[1:2] == ["-m"] and "worker" in svc["command"]}


def env(service: str) -> dict[str, str]:
    environment = COMPOSE[service].get("environment") or {}
    assert isinstance(environment, dict), f"{service}: write environment as a mapping"
    return {key: str(value) for key, value in environment.items()}


def bind_mounts(service: str) -> dict[str, Path]:
    """Container path -> host path, for the service's ./ bind mounts."""
    mounts = {}
    for volume in COMPOSE[service].get("volumes", []):
        source, target, *_ = volume.split(":")
        if source.startswith("./"):
            mounts[target] = REPO / source
    return mounts


def on_host(service: str, container_path: str) -> Path | None:
    for target, source in bind_mounts(service).items():
        if container_path == target or container_path.startswith(target + "/"):
            return source / container_path.removeprefix(target).lstrip("/")
    return None


# -- (a) the same services, commands and settings as `qm demo` ----------------------------------


def demo_commands(tmp_path, monkeypatch) -> dict[str, list[str]]:
    """The argv services/demo/stack.py starts each service with (Popen intercepted)."""
    started = []
    monkeypatch.setattr(stack.subprocess, "Popen", lambda args, **_: started.append(args))
    stack.Stack(tmp_path, {}).start()
    return dict(zip(stack.SERVICES, started, strict=True))


def demo_settings() -> set[str]:
    """The QM_* keys services/demo/run.py passes to its Stack."""
    tree = ast.parse((REPO / "services/demo/run.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Stack":
            return {key.value for key in node.args[1].keys}
    raise AssertionError("services/demo/run.py no longer builds a Stack(run_dir, {...})")


def test_compose_runs_the_demo_services_with_the_demo_command(tmp_path, monkeypatch):
    expected = demo_commands(tmp_path, monkeypatch)
    assert set(qm_services()) == set(expected)
    for name, svc in qm_services().items():
        command = svc["command"]
        assert command[0] == "python" and command[1:] == expected[name][1:], name


def test_every_module_compose_runs_exists():
    for name, svc in COMPOSE.items():
        command = svc.get("command", [])
        if command[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(command[2] + ".__main__"), f"{name}: no module {command[2]}"
        if command[:3] == ["python", "-m", "services.sim"]:
            try:
                sim_parser().parse_args(command[3:])
            except SystemExit:
                pytest.fail(f"{name}: `python -m services.sim` refuses {command[3:]}")


def test_services_get_the_demo_settings_and_only_settings_the_code_reads():
    source = "\n".join(p.read_text() for p in (REPO / "services").rglob("*.py"))
    # QM_WEB_PORT: stack.py sets one per service, and the compose healthcheck reads it.
    wanted = demo_settings() - PER_RUN_SETTINGS | {"QM_WEB_PORT"}
    for name in qm_services():
        settings = env(name)
        assert wanted <= set(settings), f"{name} lacks {wanted - set(settings)}"
        assert settings["QM_WEB_HOST"] == "0.0.0.0", f"{name}: Prometheus could not reach a loopback-only port"
    for name in COMPOSE:
        for key in env(name):
            if key.startswith("QM_"):
                assert key in source, f"{name}: nothing in services/ reads {key}"


def test_services_reach_the_broker_on_its_container_listener():
    advertised = env("kafka")["KAFKA_ADVERTISED_LISTENERS"]
    for name in COMPOSE:
        bootstrap = env(name).get("QM_KAFKA_BOOTSTRAP")
        if bootstrap:
            assert f"//{bootstrap}" in advertised, f"{name}: kafka does not advertise {bootstrap}"


def test_pods_ready_timeout_matches_the_simulator_speed():
    speed = sim_parser().parse_args(COMPOSE["simulator"]["command"][3:]).speed
    timeout = float(env("queue-manager")["QM_PODS_READY_TIMEOUT_S"])
    assert timeout >= max(900, speed * 10), "services/demo/run.py's rule: pods start before reservations expire"


# -- (b) Prometheus scrapes every service where it listens --------------------------------------


def test_prometheus_scrapes_every_service_on_its_port():
    expected = set()
    for name in qm_services():
        expected.add(f"{name}:{Settings.from_env(name, env(name)).web_port}")
        if "QM_WEBHOOK_PORT" in env(name):
            expected.add(f"{name}:{env(name)['QM_WEBHOOK_PORT']}")
    scraped = {target for job in PROMETHEUS["scrape_configs"] for static in job["static_configs"]
               for target in static["targets"]}
    assert scraped == expected
    assert on_host("prometheus", "/etc/prometheus/prometheus.yml") == REPO / "deploy/prometheus/prometheus.yml"


# -- (c) the dashboard asks only for metrics the services define --------------------------------

_DEFINITION = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([A-Za-z_:][A-Za-z0-9_:]*)\"")
_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                "offset"}


def exported_metric_names() -> set[str]:
    """Every series name prometheus_client exposes for the metrics defined in services/."""
    names = set()
    for path in (REPO / "services").rglob("*.py"):
        source = path.read_text()
        if "prometheus_client" not in source:
            continue
        for kind, name in _DEFINITION.findall(source):
            if kind == "Counter":
                names.add(name.removesuffix("_total") + "_total")
            elif kind == "Gauge":
                names.add(name)
            else:
                names |= {f"{name}_sum", f"{name}_count", f"{name}_bucket" if kind == "Histogram" else name}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers left once label matchers, ranges, grouping
    clauses, keywords and function calls are taken out."""
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    found = re.findall(r"(?<![\w.$])([A-Za-z_][A-Za-z0-9_:]*)\b(?!\s*\()", expr)
    return set(found) - _NOT_METRICS


def dashboard_exprs() -> list[tuple[str, str, str]]:
    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    return [(path.name, panel["title"], target["expr"])
            for path in DASHBOARDS for panel in panels(json.loads(path.read_text())["panels"])
            for target in panel.get("targets", [])]


def test_metric_name_reader():
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y"}[$__rate_interval])))') == {
        "a_bucket"}
    assert metric_names("sum(increase(b_total[1h])) / sum(c)") == {"b_total", "c"}
    # A counter is exposed with _total whether or not its definition says so.
    assert {"qm_admission_requests_total", "qm_messages_consumed_total"} <= exported_metric_names()
    assert "qm_admission_requests" not in exported_metric_names()


@pytest.mark.parametrize(("dashboard", "panel", "expr"), dashboard_exprs())
def test_dashboard_uses_only_metrics_the_services_export(dashboard, panel, expr):
    names = metric_names(expr)
    assert names, f"no metric found in {expr!r}"
    unknown = names - exported_metric_names() - PROMETHEUS_SERIES
    assert not unknown, f"{dashboard} / {panel}: no service defines {sorted(unknown)}"


# -- (d) Grafana's provisioning points at what exists -------------------------------------------


def test_grafana_provisioning_points_at_the_dashboards_and_prometheus():
    provisioning = on_host("grafana", "/etc/grafana/provisioning")
    assert provisioning and provisioning.is_dir()
    providers = [p for f in (provisioning / "dashboards").glob("*.y*ml") for p in yaml.safe_load(f.read_text())["providers"]]
    assert providers
    for provider in providers:
        folder = on_host("grafana", provider["options"]["path"])
        assert folder == GRAFANA / "dashboards" and DASHBOARDS, provider["options"]["path"]
    home = on_host("grafana", env("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home in DASHBOARDS

    sources = [d for f in (provisioning / "datasources").glob("*.y*ml") for d in yaml.safe_load(f.read_text())["datasources"]]
    assert [d["url"] for d in sources] == ["http://prometheus:9090"] and "prometheus" in COMPOSE
    uids = {d["uid"] for d in sources}
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            if "datasource" in panel:
                assert panel["datasource"]["uid"] in uids, f"{path.name} / {panel['title']}"
