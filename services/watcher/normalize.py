"""Pure normalization: Kubernetes object dicts -> Quartermaster observation events.

No I/O, no clock, no logging: every function takes the object (as the API server's JSON, a
plain dict) and returns values. The watch loop (watch.py) is a thin shell around these.

Event ids are deterministic (ARCHITECTURE.md §2): ``event_id(uid, version, event_type)``.
* Facts that happen once in an object's life (a workload was submitted, a pod started running,
  a pod finished) use the fixed version ``"once"``: a re-list, a restart from an old
  resourceVersion or a watcher that lost its state all produce the same id, so nothing
  downstream doubles.
* Facts that can change again (node capacity, namespace labels) use the resourceVersion of the
  object version that showed the change; the watch loop emits them only when the normalized
  fact differs from the last one it emitted, so a re-list of unchanged objects emits nothing.
Events are services/contracts records in their envelopes (schemas/ is the source). See
docs/adr/0008-real-test-cluster-and-watcher-ids.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from services.contracts.codec import Envelope, envelope_to_dict, event_id_for, make_envelope
from services.contracts.events import (
    ActionOutcome,
    ClockTick,
    NamespaceLabels,
    NodeCapacity,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadSubmitted,
)
from services.core.quota.flavors import pod_tolerations, required_node_affinity

PRODUCER = "watcher"

QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
COST_CENTER_LABEL = "quartermaster.dev/cost-center"
GPU_RESOURCE = "nvidia.com/gpu"

WORKLOAD_SUBMITTED = "workload.submitted.v1"
WORKLOAD_FINISHED = "workload.finished.v1"
POD_RUNNING = "pod.running.v1"
POD_FINISHED = "pod.finished.v1"
NODE_CAPACITY = "node.capacity.v1"
NAMESPACE_LABELS = "namespace.labels.v1"
ACTION_OUTCOME = "action.outcome.v1"
CLOCK_TICK = "clock.tick.v1"

TOPIC_CLUSTER = "qm.cluster"
TOPIC_CLOCK = "qm.clock"

ONCE = "once"
# Only when an object carries no time at all and the caller gave none (the watcher always passes
# its observation time): a valid timestamp that is obviously not a real one.
UNKNOWN_TIME = "1970-01-01T00:00:00Z"


def event_id(uid: str, version: str, event_type: str) -> str:
    """Deterministic id: the same (object uid, version, type) always gives the same id
    (the contracts' ``event_id_for(event_type, uid, version)``)."""
    return event_id_for(event_type, uid, version)


def _event(record: Any, identity: tuple, occurred_at: str, cause: Envelope | None = None) -> dict[str, Any]:
    """A typed record (services/contracts) in its envelope, as the JSON-able dict that goes on the bus."""
    return envelope_to_dict(make_envelope(record, producer=PRODUCER, occurred_at=occurred_at or UNKNOWN_TIME,
                                          identity=identity, cause=cause))


# ---------------------------------------------------------------------------- quantities

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}


def quantity_milli(q: str | int | float) -> int:
    """A Kubernetes quantity ("500m", "8", "16Gi", "1e3") in integer milli-units, rounded up."""
    s = str(q).strip()
    if not s:
        raise ValueError("empty quantity")
    for suffix, mult in _BINARY.items():
        if s.endswith(suffix):
            return _ceil(Decimal(s[: -len(suffix)]) * mult * 1000)
    if s[-1] in "numkMGTPE" and not s[-1].isdigit():
        # "1E3" is an exponent, "1E" would be exa: only treat it as a suffix if no digit follows.
        return _ceil(Decimal(s[:-1]) * _DECIMAL[s[-1]] * 1000)
    return _ceil(Decimal(s) * 1000)


def _ceil(d: Decimal) -> int:
    i = int(d)
    return i + 1 if d > i else i


def _container_requests(c: Mapping[str, Any]) -> dict[str, int]:
    res = c.get("resources") or {}
    requests = dict(res.get("requests") or {})
    # Kubernetes defaults a missing request to the limit (extended resources like GPUs are
    # usually given as limits only).
    for name, value in (res.get("limits") or {}).items():
        requests.setdefault(name, value)
    return {name: quantity_milli(v) for name, v in requests.items()}


def pod_requests_milli(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """Effective per-pod requests: max(sum of containers, largest init container), plus overhead."""
    total: dict[str, int] = {}
    for c in pod_spec.get("containers") or []:
        for name, v in _container_requests(c).items():
            total[name] = total.get(name, 0) + v
    for c in pod_spec.get("initContainers") or []:
        for name, v in _container_requests(c).items():
            total[name] = max(total.get(name, 0), v)
    for name, v in (pod_spec.get("overhead") or {}).items():
        total[name] = total.get(name, 0) + quantity_milli(v)
    return dict(sorted(total.items()))


# ---------------------------------------------------------------------------- flavors


@dataclass(frozen=True)
class Flavor:
    """What the watcher needs of a Kueue ResourceFlavor: how to recognise and pin its nodes."""

    name: str
    node_labels: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def matches(self, node_labels: Mapping[str, str]) -> bool:
        return bool(self.node_labels) and all(node_labels.get(k) == v for k, v in self.node_labels.items())


def flavors_from_objects(objects: Iterable[Mapping[str, Any]]) -> dict[str, Flavor]:
    """ResourceFlavor objects (kueue.x-k8s.io v1beta1/v1beta2, as dicts) -> flavors by name."""
    out: dict[str, Flavor] = {}
    for obj in objects:
        if obj.get("kind") != "ResourceFlavor":
            continue
        spec = obj.get("spec") or {}
        name = obj["metadata"]["name"]
        out[name] = Flavor(
            name=name,
            node_labels=dict(spec.get("nodeLabels") or {}),
            tolerations=tuple(spec.get("tolerations") or ()),
        )
    return out


# ---------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Observation:
    """One event for the bus: where it goes, its key, and the envelope."""

    topic: str
    key: str
    event: dict[str, Any]
    # The normalized fact without volatile fields, compared to decide whether a changed object
    # is a changed fact (watch.py emits only when it differs from the last one emitted).
    fact: tuple[Any, ...] = ()

    @property
    def event_id(self) -> str:
        return self.event["event_id"]

    @property
    def event_type(self) -> str:
        return self.event["event_type"]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _owner(meta: Mapping[str, Any]) -> str | None:
    """The controlling owner as "Kind/name" (e.g. a PyTorchJob that created the Job)."""
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    if ref is None:
        return None
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


# Annotations worth carrying: the ones Kueue and Quartermaster read (not kubectl's last-applied).
_ANNOTATION_PREFIXES = ("kueue.x-k8s.io/", "quartermaster.dev/", "provreq.kueue.x-k8s.io/")


def _annotations(meta: Mapping[str, Any]) -> dict[str, str] | None:
    anns = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(_ANNOTATION_PREFIXES)}
    return dict(sorted(anns.items())) or None


def _pod_set(name: str, count: int, pod_spec: Mapping[str, Any], min_count: int | None = None) -> dict[str, Any]:
    ps: dict[str, Any] = {"name": name, "count": count, "requests": pod_requests_milli(pod_spec)}
    if min_count is not None and 1 <= min_count < count:
        ps["min_count"] = min_count
    # Flavor assignment honours it, as Kueue's does: a Job asking for h100 nodes is never given
    # a100 quota (and then pinned to a100 nodes over its own selector; ADR 0070)
    selector = {str(k): str(v) for k, v in (pod_spec.get("nodeSelector") or {}).items()}
    if selector:
        ps["node_selector"] = dict(sorted(selector.items()))
    affinity = required_node_affinity(pod_spec)  # the same, ADR 0071
    if affinity:
        ps["node_affinity"] = affinity
    tolerations = pod_tolerations(pod_spec)  # a flavor's taints must be tolerated, ADR 0072
    if tolerations:
        ps["tolerations"] = tolerations
    return ps


def _submitted(meta: Mapping[str, Any], queue: str, pod_sets: list[dict[str, Any]],
               priority_class: str | None) -> Observation:
    uid = meta["uid"]
    labels = meta.get("labels") or {}
    created = meta.get("creationTimestamp") or ""
    record = WorkloadSubmitted(
        uid=uid,
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        kind="Job",
        pod_sets=pod_sets,
        created_at=created or UNKNOWN_TIME,
        queue_name=queue,
        priority_class=priority_class,
        labels=dict(labels) or None,
        annotations=_annotations(meta),
        owner=_owner(meta),
    )
    return Observation(topic=TOPIC_CLUSTER, key=uid,
                       event=_event(record, (uid, ONCE), created), fact=(WORKLOAD_SUBMITTED,))


def workload_submitted(job: Mapping[str, Any], queue: str | None = None) -> Observation | None:
    """A batch/v1 Job that carries the queue-name label -> workload.submitted.v1, else None.
    One pod set: count = min(parallelism, completions); requests per pod from the template.
    `queue`, when given, is the queue the Job was first reported under and stands for the label
    (ADR 0067)."""
    meta = _meta(job)
    labels = meta.get("labels") or {}
    queue = queue or labels.get(QUEUE_NAME_LABEL)
    if not queue:
        return None
    spec = job.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    parallelism = int(spec["parallelism"]) if spec.get("parallelism") is not None else 1
    completions = spec.get("completions")
    count = min(parallelism, int(completions)) if completions is not None else parallelism
    if count < 1:
        return None  # parallelism 0: nothing asks to run yet
    # Partial admission (Kueue's job-min-parallelism annotation), when present.
    min_count = _int_or_none((meta.get("annotations") or {}).get("kueue.x-k8s.io/job-min-parallelism"))
    return _submitted(meta, queue, [_pod_set("main", count, pod_spec, min_count)],
                      labels.get(PRIORITY_CLASS_LABEL) or pod_spec.get("priorityClassName"))


def volcano_job_submitted(vcjob: Mapping[str, Any], queue: str | None = None) -> Observation | None:
    """A Volcano Job (batch.volcano.sh/v1alpha1) with the queue-name label -> workload.submitted.v1,
    one pod set per task (replicas, the task template's requests). A gang minimum below the
    total (minAvailable) becomes min_count on the first pod set, the others counted whole.
    `queue` as for `workload_submitted`."""
    meta = _meta(vcjob)
    labels = meta.get("labels") or {}
    queue = queue or labels.get(QUEUE_NAME_LABEL)
    if not queue:
        return None
    spec = vcjob.get("spec") or {}
    tasks = [t for t in spec.get("tasks") or [] if int(t.get("replicas", 1)) > 0]
    if not tasks:
        return None
    pod_sets = [_pod_set(t.get("name") or f"task-{i}", int(t.get("replicas", 1)),
                         (t.get("template") or {}).get("spec") or {}) for i, t in enumerate(tasks)]
    min_available = _int_or_none(spec.get("minAvailable"))
    total = sum(ps["count"] for ps in pod_sets)
    if min_available is not None and 1 <= min_available < total:
        pod_sets[0]["min_count"] = max(1, min_available - (total - pod_sets[0]["count"]))
    first_pod_spec = (tasks[0].get("template") or {}).get("spec") or {}
    return _submitted(meta, queue, pod_sets, labels.get(PRIORITY_CLASS_LABEL) or spec.get("priorityClassName")
                      or first_pod_spec.get("priorityClassName"))


def _int_or_none(v: Any) -> int | None:
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def queue_label(obj: Mapping[str, Any]) -> str | None:
    """The object's kueue.x-k8s.io/queue-name label, if any."""
    return (_meta(obj).get("labels") or {}).get(QUEUE_NAME_LABEL) or None


def pod_workload(pod: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(workload uid, workload name) of a Job's (or Volcano Job's) pod; (None, None) otherwise."""
    return _pod_workload(_meta(pod))


# A Volcano Job's terminal phases (status.state.phase), and whether each is a success.
_VOLCANO_ENDS = {"Completed": True, "Failed": False, "Terminated": False, "Aborted": False}


def workload_finished(job: Mapping[str, Any], *, deleted: bool = False, volcano: bool = False,
                      observed_at: str = "", queue: str | None = None) -> Observation | None:
    """workload.finished.v1 once a queue-labelled Job has finished: a batch/v1 Job with its
    Complete or Failed condition true (a Volcano Job in a terminal phase), or one deleted before
    that (Kueue deletes a deleted Job's Workload, and its quota goes back). None while it runs
    or waits, and for Jobs without the queue-name label (no workload of ours).

    Without this fact the queue-manager never released a real Job's quota (the simulated
    clusters emit it themselves; ADR 0064). Its id is the Job's uid and "once": the deletion of a
    Job that had finished says the same fact again, and readers drop the copy. `queue` as for
    `workload_submitted`: a Job whose label was removed while it ran still ends in its queue."""
    meta = _meta(job)
    queue = queue or queue_label(job)
    if not queue:
        return None
    status = job.get("status") or {}
    if volcano:
        phase = (status.get("state") or {}).get("phase")
        succeeded = _VOLCANO_ENDS.get(phase or "")
        ended = ((status.get("state") or {}).get("lastTransitionTime") if succeeded is not None else None)
    else:
        ends = {c.get("type"): c for c in status.get("conditions") or []
                if c.get("type") in ("Complete", "Failed") and c.get("status") == "True"}
        end = ends.get("Complete") or ends.get("Failed")
        succeeded = None if end is None else end.get("type") == "Complete"
        ended = None if end is None else status.get("completionTime") or end.get("lastTransitionTime")
    if succeeded is None and not deleted:
        return None
    at = ended or (meta.get("deletionTimestamp") if deleted else None) or observed_at or UNKNOWN_TIME
    record = WorkloadFinished(uid=meta["uid"], namespace=meta.get("namespace", ""), name=meta.get("name", ""),
                              succeeded=bool(succeeded), finished_at=at, queue_name=queue)
    return Observation(topic=TOPIC_CLUSTER, key=meta["uid"], event=_event(record, (meta["uid"], ONCE), at),
                       fact=(WORKLOAD_FINISHED,))


def _pod_workload(meta: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(workload uid, workload name) of a Job's (or Volcano Job's) pod."""
    refs = meta.get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    labels = meta.get("labels") or {}
    if ref and ref.get("kind") == "Job":
        return ref.get("uid"), ref.get("name")
    uid = labels.get("batch.kubernetes.io/controller-uid") or labels.get("controller-uid")
    return uid, labels.get("batch.kubernetes.io/job-name") or labels.get("job-name")


def _started_at(status: Mapping[str, Any]) -> str | None:
    starts = [((cs.get("state") or {}).get("running") or (cs.get("state") or {}).get("terminated") or {})
              .get("startedAt") for cs in status.get("containerStatuses") or []]
    starts = [s for s in starts if s]
    return min(starts) if starts else status.get("startTime")


def _finished_at(status: Mapping[str, Any]) -> str | None:
    ends = [((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
            for cs in status.get("containerStatuses") or []]
    ends = [e for e in ends if e]
    return max(ends) if ends else None


def pod_observations(pod: Mapping[str, Any], deleted: bool = False, *, observed_at: str = "",
                     owner_queue: str | None = None) -> list[Observation]:
    """pod.running.v1 once a workload's pod runs on a node; pod.finished.v1 once it succeeded,
    failed, or was deleted after running (an evicted pod). A pod that ran and finished between
    two looks yields both. Pods that belong to no workload yield nothing.

    `owner_queue` is the queue-name label of the pod's Job, for a pod that does not carry the
    label itself: a Job's labels are not copied to its pods, and admission routes pod facts to
    their cohort by it (ADR 0064)."""
    meta = _meta(pod)
    workload_uid, workload_name = _pod_workload(meta)
    if not workload_uid:
        return []
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    phase = status.get("phase")
    uid = meta["uid"]
    node = spec.get("nodeName")
    queue = queue_label(pod) or owner_queue
    common = {"uid": uid, "workload_uid": workload_uid, "namespace": meta.get("namespace", ""),
              "name": meta.get("name", ""), "node": node, "queue_name": queue, "workload_name": workload_name}
    out: list[Observation] = []
    started = _started_at(status)
    ran = bool(node) and (phase in ("Running", "Succeeded", "Failed") or (deleted and started is not None))
    if ran:
        at = started or meta.get("creationTimestamp") or observed_at or UNKNOWN_TIME
        out.append(Observation(
            topic=TOPIC_CLUSTER, key=workload_uid,
            event=_event(PodRunning(**common, started_at=at, requests=pod_requests_milli(spec)), (uid, ONCE), at),
            fact=(POD_RUNNING,),
        ))
    if phase in ("Succeeded", "Failed") or (deleted and ran):
        ended = (_finished_at(status) or meta.get("deletionTimestamp") or observed_at
                 or started or meta.get("creationTimestamp") or UNKNOWN_TIME)
        outcome = phase if phase in ("Succeeded", "Failed") else "Deleted"
        out.append(Observation(
            topic=TOPIC_CLUSTER, key=workload_uid,
            event=_event(PodFinished(**common, phase=outcome, finished_at=ended), (uid, ONCE), ended),
            fact=(POD_FINISHED,),
        ))
    return out


def node_capacity(node: Mapping[str, Any], flavors: Mapping[str, Flavor], *, deleted: bool = False,
                  observed_at: str = "") -> Observation:
    """node.capacity.v1: the node's capacity and allocatable (milli-units) and the flavor whose
    nodeLabels it carries (the first by name when several match). Cordoned or deleted nodes
    say so; consumers count no allocatable for them."""
    meta = _meta(node)
    labels = dict(sorted((meta.get("labels") or {}).items()))
    status = node.get("status") or {}
    capacity = {k: quantity_milli(v) for k, v in sorted((status.get("capacity") or {}).items())}
    allocatable = {k: quantity_milli(v) for k, v in sorted((status.get("allocatable") or {}).items())}
    unschedulable = bool((node.get("spec") or {}).get("unschedulable", False))
    matched = sorted(name for name, f in flavors.items() if f.matches(labels))
    flavor = matched[0] if matched else None
    uid = meta["uid"]
    rv = meta.get("resourceVersion", "")
    record = NodeCapacity(node=meta.get("name", ""), allocatable=allocatable, flavor=flavor, labels=labels,
                          capacity=capacity, unschedulable=unschedulable, deleted=deleted)
    fact = (NODE_CAPACITY, flavor, tuple(capacity.items()), tuple(allocatable.items()), unschedulable, deleted)
    version = f"{rv}/deleted" if deleted else rv
    return Observation(
        topic=TOPIC_CLUSTER, key=uid,
        event=_event(record, (uid, version), observed_at or meta.get("creationTimestamp") or ""),
        fact=fact,
    )


def namespace_labels(ns: Mapping[str, Any], *, deleted: bool = False, observed_at: str = "") -> Observation:
    """namespace.labels.v1: the namespace's labels (its cost center is one of them)."""
    meta = _meta(ns)
    labels = dict(sorted((meta.get("labels") or {}).items()))
    uid = meta["uid"]
    rv = meta.get("resourceVersion", "")
    version = f"{rv}/deleted" if deleted else rv
    return Observation(
        topic=TOPIC_CLUSTER, key=meta.get("name", uid),
        event=_event(NamespaceLabels(namespace=meta.get("name", ""), labels=labels, deleted=deleted),
                     (uid, version), observed_at or meta.get("creationTimestamp") or ""),
        fact=(NAMESPACE_LABELS, tuple(labels.items()), deleted),
    )


def cost_center(labels: Mapping[str, str]) -> str | None:
    return labels.get(COST_CENTER_LABEL) or labels.get("cost-center")


def clock_tick(source: str, at_iso: str) -> Observation:
    """clock.tick.v1: event time advances; one id per (source, instant)."""
    return Observation(
        topic=TOPIC_CLOCK, key=source,
        event=_event(ClockTick(at=at_iso, source=source), (source, at_iso), at_iso),
        fact=(CLOCK_TICK, at_iso),
    )


ACTION_NAMES = {"action.admit.v1": "admit", "action.evict.v1": "evict", "action.cleanup.v1": "cleanup"}


def action_outcome(action: Mapping[str, Any], outcome: str, message: str, *, occurred_at: str) -> Observation:
    """action.outcome.v1: what became of one qm.actions command. Its id is a function of the
    action's id and the outcome, so re-applying an action re-reports the same event."""
    p = action.get("payload") or {}
    uid = p.get("workload_uid", "")
    aid = action.get("event_id", "")
    cause = Envelope(event_id=aid, event_type=action.get("event_type", ""), occurred_at=occurred_at,
                     producer=action.get("producer", ""), payload=None,
                     correlation_id=action.get("correlation_id"), causation_id=action.get("causation_id"))
    record = ActionOutcome(action_event_id=aid, workload_uid=uid,
                           action=ACTION_NAMES.get(action.get("event_type", ""), "admit"),
                           outcome=outcome, message=message or None)
    return Observation(
        topic=TOPIC_CLUSTER, key=uid,
        event=_event(record, (aid, outcome), occurred_at, cause=cause),
        fact=(ACTION_OUTCOME, aid, outcome),
    )


def observe(kind: str, obj: Mapping[str, Any], flavors: Mapping[str, Flavor], *, deleted: bool = False,
            observed_at: str = "", owner_queue: str | None = None, job_queue: str | None = None
            ) -> list[Observation]:
    """Dispatch by resource kind: "pods", "jobs" (batch/v1), "vcjobs" (Volcano), "nodes",
    "namespaces". Kueue Workloads are watched but not turned into events: in a Kueue cluster
    they mirror the Jobs already reported, and reporting both would submit each workload twice.
    `owner_queue`: a pod's Job's queue; `job_queue`: the queue a Job was first reported under."""
    if kind == "pods":
        return pod_observations(obj, deleted=deleted, observed_at=observed_at, owner_queue=owner_queue)
    if kind in ("jobs", "vcjobs"):
        volcano = kind == "vcjobs"
        submitted = None if deleted else (volcano_job_submitted(obj, job_queue) if volcano
                                          else workload_submitted(obj, job_queue))
        finished = workload_finished(obj, deleted=deleted, volcano=volcano, observed_at=observed_at,
                                     queue=job_queue)
        return [o for o in (submitted, finished) if o is not None]
    if kind == "nodes":
        return [node_capacity(obj, flavors, deleted=deleted, observed_at=observed_at)]
    if kind == "namespaces":
        return [namespace_labels(obj, deleted=deleted, observed_at=observed_at)]
    return []
