"""`qm policy test`: run suites in gatekeeper-library's `suite.yaml` format (`gator verify`).

    kind: Suite
    apiVersion: test.gatekeeper.sh/v1alpha1
    tests:
    - name: ...
      template: template.yaml              # optional for quartermaster.dev policies
      constraint: samples/x/constraint.yaml
      cases:
      - name: ...
        object: samples/x/example_disallowed.yaml
        inventory: [samples/x/namespace.yaml]   # Namespaces used for namespaceSelector / namespaceObject
        usage: samples/x/usage.yaml             # Quartermaster: qm.usage record of the namespace
        budget: samples/x/budget.yaml           # Quartermaster: qm.budgets record
        cluster: samples/x/cluster.yaml         # Quartermaster: cluster signals
        operation: CREATE                       # Quartermaster: default CREATE
        assertions:
        - violations: yes | no | N
          message: "regex"                      # counts only violations whose message matches

Every violation counts, whatever its enforcementAction (as `gator verify` does).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.contracts import yaml_documents
from services.policy.errors import PolicyError
from services.policy.evaluate import AdmissionDecision, evaluate
from services.policy.loader import PolicySet, read_documents
from services.policy.model import EnforcementPoint


@dataclass(frozen=True)
class CaseResult:
    suite: str
    test: str
    case: str
    passed: bool
    detail: str
    duration_s: float

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.test}/{self.case}"


class SuiteError(Exception):
    """A suite file that cannot be run (missing file, bad format)."""


def _load_one(path: Path) -> Any:
    try:
        docs = [d for d in yaml_documents.load_all(path.read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise SuiteError(f"{path}: {e}") from None
    if len(docs) != 1:
        raise SuiteError(f"{path}: expected exactly one document, found {len(docs)}")
    return docs[0]


def _count_ok(expected: Any, count: int) -> tuple[bool, str]:
    if expected is True or expected == "yes":
        return count >= 1, "at least 1"
    if expected is False or expected == "no":
        return count == 0, "0"
    if isinstance(expected, int) or (isinstance(expected, str) and expected.isdigit()):
        return count == int(expected), str(int(expected))
    raise SuiteError(f"violations must be yes, no or an integer (got {expected!r})")


def check_assertions(assertions: list[dict[str, Any]], decision: AdmissionDecision) -> list[str]:
    """Failed assertion descriptions; empty when all hold."""
    failures = []
    for a in assertions or [{"violations": "yes"}]:
        pattern = a.get("message")
        msgs = [v.message for v in decision.violations]
        if pattern is not None:
            msgs = [m for m in msgs if re.search(str(pattern), m)]
        ok, want = _count_ok(a.get("violations", "yes"), len(msgs))
        if not ok:
            where = f" matching /{pattern}/" if pattern is not None else ""
            got = "; ".join(v.render() for v in decision.violations) or "none"
            failures.append(f"want {want} violation(s){where}, got {len(msgs)} (violations: {got})")
    return failures


def run_suite(suite_path: str | Path) -> list[CaseResult]:
    suite_path = Path(suite_path)
    base = suite_path.parent
    suite = _load_one(suite_path)
    if not isinstance(suite, dict) or suite.get("kind") != "Suite":
        raise SuiteError(f"{suite_path}: not a Suite (kind: Suite)")
    suite_name = (suite.get("metadata") or {}).get("name") or base.name
    results: list[CaseResult] = []
    for test in suite.get("tests") or []:
        tname = test.get("name", "?")
        files = [base / test[k] for k in ("template", "constraint") if test.get(k)]
        t0 = time.perf_counter()
        try:
            docs, digest = read_documents(files)
            policy_set = PolicySet.from_documents(docs, version=digest)
        except PolicyError as e:
            results.append(
                CaseResult(
                    suite_name, tname, "(load)", False, f"policy refused: {e}", time.perf_counter() - t0
                )
            )
            continue
        if not policy_set.policies:
            results.append(
                CaseResult(suite_name, tname, "(load)", False, "no constraint or policy found", 0.0)
            )
            continue
        for case in test.get("cases") or []:
            results.append(_run_case(suite_name, tname, base, policy_set, case))
    return results


def _run_case(
    suite_name: str, tname: str, base: Path, policy_set: PolicySet, case: dict[str, Any]
) -> CaseResult:
    cname = case.get("name", "?")
    t0 = time.perf_counter()
    try:
        obj = _load_one(base / case["object"])
        inventory = []
        for f in case.get("inventory") or []:
            docs, _ = read_documents([base / f])
            inventory.extend(d.body for d in docs)
        namespace_object = None
        ns = (obj.get("metadata") or {}).get("namespace")
        for item in inventory:
            if item.get("kind") == "Namespace" and (item.get("metadata") or {}).get("name") == ns:
                namespace_object = item
        extra = {
            k: _load_one(base / case[k]) if case.get(k) else None for k in ("usage", "budget", "cluster")
        }
        decision = evaluate(
            policy_set,
            obj,
            namespace_object,
            extra["usage"],
            extra["budget"],
            extra["cluster"],
            case.get("operation", "CREATE"),
            enforcement_point=EnforcementPoint.GATOR,
        )
        failures = check_assertions(case.get("assertions") or [], decision)
    except (SuiteError, KeyError, PolicyError) as e:
        return CaseResult(suite_name, tname, cname, False, f"cannot run case: {e}", time.perf_counter() - t0)
    detail = "; ".join(failures) if failures else "; ".join(v.render() for v in decision.violations)
    return CaseResult(suite_name, tname, cname, not failures, detail, time.perf_counter() - t0)


def find_suites(root: str | Path) -> list[Path]:
    root = Path(root)
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("suite.y*ml") if p.suffix in (".yaml", ".yml"))
