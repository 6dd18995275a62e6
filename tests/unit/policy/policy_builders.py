"""Fluent builders for policy tests (Kueue-style: make_job("a").gpus(4).obj())."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from services.policy import PolicySet
from services.policy.loader import Document


class JobBuilder:
    def __init__(self, name: str, namespace: str = "ml-team") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {}},
            "spec": {"parallelism": 1, "template": {"spec": {"containers": [{"name": "c", "image": "img"}]}}},
        }

    def label(self, key: str, value: str) -> JobBuilder:
        self._obj["metadata"]["labels"][key] = value
        return self

    def queue(self, name: str) -> JobBuilder:
        return self.label("kueue.x-k8s.io/queue-name", name)

    def parallelism(self, n: int) -> JobBuilder:
        self._obj["spec"]["parallelism"] = n
        return self

    def gpus(self, per_pod: int | str, where: str = "limits") -> JobBuilder:
        c = self._obj["spec"]["template"]["spec"]["containers"][0]
        c.setdefault("resources", {}).setdefault(where, {})["nvidia.com/gpu"] = str(per_pod)
        return self

    def node_selector(self, key: str, value: str) -> JobBuilder:
        self._obj["spec"]["template"]["spec"].setdefault("nodeSelector", {})[key] = value
        return self

    def suspend(self, value: bool) -> JobBuilder:
        self._obj["spec"]["suspend"] = value
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def make_job(name: str = "job", namespace: str = "ml-team") -> JobBuilder:
    return JobBuilder(name, namespace)


def make_namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}}


def usage(namespace: str, running: int = 0, reserved: int = 0, flavor: str = "a100-flavor") -> dict[str, Any]:
    return {
        "namespace": namespace,
        "reserved": {flavor: {"nvidia.com/gpu": reserved * 1000}} if reserved else {},
        "running": {flavor: {"nvidia.com/gpu": running * 1000}} if running else {},
        "total": {"nvidia.com/gpu": (running + reserved) * 1000},
    }


def policy_set(text: str, file: str = "inline.yaml") -> PolicySet:
    docs = [Document(file, i, d) for i, d in enumerate(yaml.safe_load_all(text)) if d]
    return PolicySet.from_documents(docs)


GPU_MAX_TEMPLATE = """
apiVersion: templates.gatekeeper.sh/v1
kind: ConstraintTemplate
metadata: {name: k8sbanexcessgpuquota}
spec:
  crd:
    spec:
      names: {kind: K8sBanExcessGpuQuota}
      validation:
        openAPIV3Schema:
          type: object
          properties:
            maxGpu: {type: integer}
  targets:
  - target: admission.k8s.gatekeeper.sh
    code:
    - engine: K8sNativeValidation
      source:
        validations:
        - expression: 'usage.gpus + workload.gpus <= variables.params.maxGpu'
          messageExpression: '"namespace " + request.namespace + " used " + string(usage.gpus) + " GPU, requesting " + string(workload.gpus) + ", max is " + string(variables.params.maxGpu)'
"""


def gpu_max_constraint(name: str = "max-32", max_gpu: int = 32, action: str = "deny", extra: str = "") -> str:
    return f"""
---
apiVersion: constraints.gatekeeper.sh/v1beta1
kind: K8sBanExcessGpuQuota
metadata: {{name: {name}}}
spec:
  enforcementAction: {action}
{extra}
  match:
    kinds: [{{apiGroups: ["batch"], kinds: ["Job"]}}]
  parameters: {{maxGpu: {max_gpu}}}
"""
