"""Kueue-compatible quota core: objects, quota tree, flavor assignment, scheduling cycles,
preemption and fair sharing. Pure: standard library only, no I/O, no clock, no logging.

Typical use::

    objects = load_objects([(path, doc) for path, doc in documents])   # dicts from YAML
    snapshot = build_snapshot(objects)                                  # admitted usage
    pending = [w for w in objects.workloads if w.admission is None]
    result = schedule_cycle(snapshot, pending, now)                     # or drain(...)
    for decision in result.decisions: ...
"""

from services.core.quota.errors import ConfigError, QuotaError, UnknownWorkloadError
from services.core.quota.fairsharing import dominant_resource_share
from services.core.quota.model import (
    Admission,
    ClusterQueue,
    Cohort,
    Config,
    Decision,
    FlavorResource,
    LocalQueue,
    Objects,
    PodSet,
    PodSetAdmission,
    PreemptionReason,
    PreemptionTarget,
    Reason,
    ResourceFlavor,
    Workload,
    WorkloadStatus,
)
from services.core.quota.parse import load_objects
from services.core.quota.preemption import could_be_victim
from services.core.quota.scheduler import (
    CycleResult,
    PreemptionPlan,
    drain,
    nomination_reads_only_kind,
    preemption_targets,
    resolve_cluster_queue,
    run_cycles,
    schedule_cycle,
)
from services.core.quota.snapshot import AdmittedWorkload, Snapshot, build_snapshot, objects_behind

__all__ = [
    "Admission",
    "AdmittedWorkload",
    "ClusterQueue",
    "Cohort",
    "Config",
    "ConfigError",
    "CycleResult",
    "Decision",
    "FlavorResource",
    "LocalQueue",
    "Objects",
    "PodSet",
    "PodSetAdmission",
    "PreemptionPlan",
    "PreemptionReason",
    "PreemptionTarget",
    "QuotaError",
    "Reason",
    "ResourceFlavor",
    "Snapshot",
    "UnknownWorkloadError",
    "Workload",
    "WorkloadStatus",
    "build_snapshot",
    "could_be_victim",
    "dominant_resource_share",
    "drain",
    "load_objects",
    "nomination_reads_only_kind",
    "objects_behind",
    "preemption_targets",
    "resolve_cluster_queue",
    "run_cycles",
    "schedule_cycle",
]
