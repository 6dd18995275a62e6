"""Apply qm.actions to the cluster: Admit, Evict, Cleanup.

* ``action.admit.v1``   unsuspend the Job and pin it to the flavor (its nodeLabels as the pod
  template's nodeSelector, its tolerations added), in one update, as Kueue does; under partial
  admission (the action's ``counts`` below the Job's parallelism) the parallelism comes down to
  the admitted count. The Job's original nodeSelector/tolerations/parallelism are kept in an
  annotation so an eviction restores them.
* ``action.evict.v1``   annotate the Job and its pods with the reason and the checkpoint
  signal, wait the grace period, then suspend the Job (the Job controller deletes its pods),
  clear its status.startTime and restore the template, Kueue-style (three writes).
* ``action.cleanup.v1`` delete the Job (background propagation: its pods go too).

A Volcano Job has no suspend. The admission webhook labels its task templates and puts a
scheduling gate on its pods (ADR 0068); Admit records the placement on the Volcano Job and lifts
the gate of each of its pods, adding the flavor's nodeSelector and tolerations (what a gated pod
may still be given), and pods made later are released as the watcher sees them
(``release_if_admitted``); under partial admission only so many of each task's pods as the
quota holds are live at once, the others held (ADR 0068's addendum). Evict takes the record
away, then deletes the running pods after the grace period: Volcano makes them again, and the
webhook gates them.

Every action is idempotent (re-applying one that already took effect reports
``already-applied``), retried on 409 Conflict (re-read, re-apply) and on temporary errors, and
reported back as an ``action.outcome.v1`` event whose id is derived from the action's id.
Actions are envelopes (dicts, or ``services.contracts.codec.Envelope``) with the payloads of
schemas/events/action.*.v1.json. Admit pins ``node_selector``/``tolerations`` when the action
carries them, else the nodeLabels/tolerations of the ResourceFlavors named in ``flavors``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from services.contracts.codec import Envelope, envelope_to_dict
from services.core.held_pods import ADMISSION_GATE, admission_gated, volcano_owner

from . import normalize
from .kube import Kube, KubeError, resource_path, sleep_backoff
from .normalize import Flavor
from .watch import Sink

log = logging.getLogger("quartermaster.watcher.actuate")

ADMIT = "action.admit.v1"
EVICT = "action.evict.v1"
CLEANUP = "action.cleanup.v1"

ANN_PREFIX = "quartermaster.dev/"
ANN_ADMITTED_FLAVOR = ANN_PREFIX + "admitted-flavor"
ANN_ORIGINAL_SCHEDULING = ANN_PREFIX + "original-scheduling"
ANN_EVICT_REASON = ANN_PREFIX + "evict-reason"
ANN_CHECKPOINT = ANN_PREFIX + "checkpoint-requested"
ANN_EVICT_DEADLINE = ANN_PREFIX + "evict-deadline"
ANN_ACTION_ID = ANN_PREFIX + "last-action-id"
ANN_ADMITTED_PLACEMENT = ANN_PREFIX + "admitted-placement"  # on a Volcano Job: its pods' nodeSelector, tolerations

VOLCANO = ("batch.volcano.sh", "v1alpha1", "jobs")
VOLCANO_API = "batch.volcano.sh/v1alpha1"
_ON_VOLCANO = {"api_version": VOLCANO_API}  # an outcome's details: its Event is on a Volcano Job
_UNHELD = ("a Volcano Job created without Quartermaster's mutating webhook (its task templates lack the "
           "queue-name label, so its pods are not held by the admission gate): Volcano runs it whatever this "
           "action says. Apply deploy/kubernetes/admission-webhook.yaml, which holds a queued Volcano Job's pods "
           "until it is admitted, and create the Job again")

APPLIED = "applied"
ALREADY_APPLIED = "already-applied"
NOT_FOUND = "not-found"
FAILED = "failed"


@dataclass(frozen=True)
class ActionResult:
    """What apply() did: the outcome event it emitted, plus what the event has no field for."""

    observation: normalize.Observation
    outcome: str
    message: str
    attempts: int
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def event(self) -> dict[str, Any]:
        return self.observation.event


class _Conflict(Exception):
    pass


class _Invalid(Exception):
    """The action cannot be applied as given (retrying will not help)."""


def _ended(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


#: Where Volcano's job controller names a pod's task (a label in recent releases, an annotation in all)
VOLCANO_TASK = "volcano.sh/task-spec"


def _task_of(pod: Mapping[str, Any]) -> str | None:
    meta = pod.get("metadata") or {}
    return (meta.get("labels") or {}).get(VOLCANO_TASK) or (meta.get("annotations") or {}).get(VOLCANO_TASK)


def _pod_order(pod: Mapping[str, Any]) -> tuple[str, int, str]:
    """A task's pods by their index (<job>-<task>-<index>): pod 10 after pod 9."""
    name = (pod.get("metadata") or {}).get("name", "")
    stem, _, index = name.rpartition("-")
    return (stem, int(index), name) if index.isdigit() else (name, -1, name)


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


class Actuator:
    def __init__(self, kube: Kube, sink: Sink, *, flavors: Mapping[str, Flavor] | None = None,
                 max_attempts: int = 8, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                 sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        self.kube = kube
        self.sink = sink
        self.flavors = dict(flavors or {})
        self.max_attempts = max_attempts
        self.now = now
        self.sleep = sleep

    async def apply(self, action: Mapping[str, Any] | Envelope) -> ActionResult:
        """Apply one action envelope; emit its outcome event and return the result."""
        if isinstance(action, Envelope):
            action = envelope_to_dict(action)
        aid = action.get("event_id", "")
        etype = action.get("event_type", "")
        p = action.get("payload") or {}
        attempts = 0
        outcome, message, details = FAILED, "", {}
        handler = {ADMIT: self._admit, EVICT: self._evict, CLEANUP: self._cleanup}.get(etype)
        if handler is None:
            outcome, message = FAILED, f"unknown action {etype!r}"
        else:
            while True:
                attempts += 1
                try:
                    outcome, message, details = await handler(action, p)
                    break
                except _Invalid as e:
                    outcome, message = FAILED, str(e)
                    break
                except _Conflict as e:
                    message = f"conflict: {e}"
                except KubeError as e:
                    if e.status == 409:
                        message = f"conflict: {e.message}"
                    elif e.temporary:
                        message = str(e)
                    else:
                        outcome, message = FAILED, f"{e.status} {e.reason}: {e.message}"
                        break
                except (TimeoutError, OSError) as e:
                    message = repr(e)
                if attempts >= self.max_attempts:
                    outcome = FAILED
                    message = f"gave up after {attempts} attempts: {message}"
                    break
                await sleep_backoff(attempts - 1, base_s=0.1, cap_s=5.0)
        log.info("action %s on %s/%s: %s %s", etype, p.get("namespace"), p.get("name"), outcome, message,
                 extra={"event_id": aid, "workload_uid": p.get("workload_uid"), "decision": outcome})
        obs = normalize.action_outcome(action, outcome, message, occurred_at=_iso(self.now()))
        await self.sink(obs.topic, obs.key, obs.event)
        await self._record_event(p, etype, outcome, message, details.get("api_version", "batch/v1"))
        return ActionResult(obs, outcome, message, attempts, details)

    # ------------------------------------------------------------------ helpers

    def _job_path(self, p: Mapping[str, Any]) -> str:
        return resource_path("batch", "v1", "jobs", p["namespace"], p["name"])

    async def _get_job(self, p: Mapping[str, Any]) -> dict[str, Any] | None:
        try:
            job = await self.kube.get(self._job_path(p))
        except KubeError as e:
            if e.status == 404:
                return None
            raise
        if p.get("workload_uid") and job["metadata"]["uid"] != p["workload_uid"]:
            return None  # same name, another Job: the one the action meant is gone
        return job

    async def _get_volcano_job(self, p: Mapping[str, Any]) -> dict[str, Any] | None:
        """The action's workload as a Volcano Job, or None (none of that name and uid, or the
        CRD not served). Listed by name, which the watcher's list/watch permission allows."""
        try:
            found = await self.kube.get(resource_path(*VOLCANO, p["namespace"]),
                                        fieldSelector=f"metadata.name={p['name']}")
        except KubeError as e:
            if e.temporary:
                raise
            return None  # Volcano's CRD not served, or not readable
        for vcjob in found.get("items") or []:
            if vcjob["metadata"].get("uid") == p.get("workload_uid"):
                return vcjob
        return None

    @staticmethod
    def _held_by_gates(vcjob: Mapping[str, Any]) -> bool:
        """Whether the webhook labelled every task template, so the Job's pods come gated."""
        tasks = (vcjob.get("spec") or {}).get("tasks") or []
        return bool(tasks) and all(
            (((t.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(normalize.QUEUE_NAME_LABEL)
            for t in tasks)

    async def _volcano_pods(self, vcjob: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The Volcano Job's pods (Volcano labels them with the Job's name; the owner decides)."""
        listed = await self.kube.get(resource_path("", "v1", "pods", vcjob["metadata"]["namespace"]),
                                     labelSelector=f"volcano.sh/job-name={vcjob['metadata']['name']}")
        uid = vcjob["metadata"]["uid"]
        return [pod for pod in listed.get("items") or [] if (volcano_owner(pod) or ("",))[0] == uid]

    async def _release(self, pod: Mapping[str, Any], placement: Mapping[str, Any]) -> bool:
        """Lift the admission gate of one held pod and pin it where its Job was admitted (a gated
        pod's nodeSelector may only gain keys; tolerations may be added to any pod). One
        strategic-merge patch, so a second release of the same pod changes nothing."""
        if not admission_gated(pod):
            return False
        spec = pod.get("spec") or {}
        selector = spec.get("nodeSelector") or {}
        clash = {k: v for k, v in (placement.get("nodeSelector") or {}).items() if k in selector and selector[k] != v}
        if clash:
            raise _Invalid(f"pod {pod['metadata']['name']} asks for nodeSelector "
                           f"{ {k: selector[k] for k in clash} }, the admitted flavor for {clash}")
        tolerations = list(spec.get("tolerations") or [])
        tolerations += [t for t in placement.get("tolerations") or () if t not in tolerations]
        body: dict[str, Any] = {"spec": {"schedulingGates": [{"$patch": "delete", "name": ADMISSION_GATE}],
                                         "nodeSelector": {**selector, **(placement.get("nodeSelector") or {})}}}
        if tolerations:
            body["spec"]["tolerations"] = tolerations
        try:
            await self.kube.request("PATCH", resource_path("", "v1", "pods", pod["metadata"]["namespace"],
                                                           pod["metadata"]["name"]),
                                    body=body, content_type="application/strategic-merge-patch+json")
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def release_if_admitted(self, pod: Mapping[str, Any]) -> bool:
        """Release a held pod whose Volcano Job is admitted: one made after the Admit (a late
        controller, a restarted pod), or left held by a crash. The watcher calls it for each
        gated pod it sees; False when the pod stays held."""
        owner = volcano_owner(pod)
        if owner is None or not admission_gated(pod):
            return False
        meta = pod.get("metadata") or {}
        vcjob = await self._get_volcano_job({"namespace": meta.get("namespace", ""), "name": owner[1],
                                             "workload_uid": owner[0]})
        recorded = ((vcjob or {}).get("metadata", {}).get("annotations") or {}).get(ANN_ADMITTED_PLACEMENT)
        if recorded is None:
            return False
        placement = orjson.loads(recorded)
        if placement.get("counts") and not self._within_counts(
                pod, [p for p in await self._volcano_pods(vcjob) if p["metadata"]["name"] != meta.get("name")],
                placement):
            return False  # partial admission: its task runs as many pods as the quota holds
        released = await self._release(pod, placement)
        if released:
            log.info("released held pod %s/%s of admitted Volcano Job %s", meta.get("namespace"), meta.get("name"),
                     owner[1], extra={"workload_uid": owner[0]})
        return released

    def _placement(self, p: Mapping[str, Any]) -> Flavor:
        """Where an Admit pins the workload: the action's node_selector/tolerations, else those
        of the ResourceFlavors it names (``flavors``: pod set -> resource -> flavor)."""
        names = sorted({f for by_res in (p.get("flavors") or {}).values() for f in by_res.values()})
        if p.get("node_selector") is not None or p.get("tolerations") is not None:
            return Flavor(name=",".join(names), node_labels=dict(p.get("node_selector") or {}),
                          tolerations=tuple(p.get("tolerations") or ()))
        unknown = [n for n in names if n not in self.flavors]
        if not names or unknown:
            raise _Invalid(f"no node_selector in the action and flavor(s) {unknown or names} "
                           f"unknown to the watcher")
        labels: dict[str, str] = {}
        tolerations: list[Mapping[str, Any]] = []
        for n in names:
            labels.update(self.flavors[n].node_labels)
            tolerations.extend(t for t in self.flavors[n].tolerations if t not in tolerations)
        return Flavor(name=",".join(names), node_labels=labels, tolerations=tuple(tolerations))

    async def _put_job(self, job: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.kube.request("PUT", self._job_path(job["metadata"]), body=job)
        except KubeError as e:
            if e.status == 409:
                raise _Conflict(e.message) from e
            raise

    # ------------------------------------------------------------------ actions

    async def _admit(self, action: Mapping[str, Any], p: Mapping[str, Any]) -> tuple[str, str, dict]:
        job = await self._get_job(p)
        if job is None:
            vcjob = await self._get_volcano_job(p)
            if vcjob is None:
                return NOT_FOUND, "job not found", {}
            return await self._admit_volcano(action, p, vcjob)
        flavor = self._placement(p)
        meta = job["metadata"]
        anns = meta.setdefault("annotations", {})
        spec = job["spec"]
        pod_spec = spec["template"].setdefault("spec", {})
        selector = dict(pod_spec.get("nodeSelector") or {})
        pinned = all(selector.get(k) == v for k, v in flavor.node_labels.items())
        # Partial admission: the quota holds fewer pods than the Job asks to run at once, so it
        # runs that many (Kueue sets the Job's parallelism likewise; an eviction restores it)
        admitted = (p.get("counts") or {}).get("main")
        parallelism = admitted if admitted is not None and admitted < spec.get("parallelism", 1) else None
        if not spec.get("suspend", False) and pinned and parallelism is None:
            return ALREADY_APPLIED, f"already admitted to {flavor.name}", {"flavor": flavor.name}
        if ANN_ORIGINAL_SCHEDULING not in anns:
            anns[ANN_ORIGINAL_SCHEDULING] = orjson.dumps(
                {"nodeSelector": pod_spec.get("nodeSelector"), "tolerations": pod_spec.get("tolerations"),
                 "parallelism": spec.get("parallelism")}
            ).decode()
        if parallelism is not None:
            spec["parallelism"] = parallelism
        pod_spec["nodeSelector"] = {**selector, **flavor.node_labels}
        tolerations = list(pod_spec.get("tolerations") or [])
        for t in flavor.tolerations:
            if t not in tolerations:
                tolerations.append(dict(t))
        if tolerations:
            pod_spec["tolerations"] = tolerations
        anns[ANN_ADMITTED_FLAVOR] = flavor.name
        anns[ANN_ACTION_ID] = action.get("event_id", "")
        for k in (ANN_EVICT_REASON, ANN_CHECKPOINT, ANN_EVICT_DEADLINE):
            anns.pop(k, None)
        spec["suspend"] = False
        await self._put_job(job)
        partially = f", {parallelism} pods at a time (partial admission)" if parallelism is not None else ""
        return APPLIED, f"unsuspended with flavor {flavor.name}{partially}", {
            "flavor": flavor.name, "node_selector": pod_spec["nodeSelector"]}

    def _evict_signal(self, action: Mapping[str, Any], reason: str, grace_s: float, anns: Mapping[str, str]
                      ) -> tuple[dict[str, str], datetime]:
        """The eviction's annotations (reason, checkpoint request, deadline) and its deadline."""
        if anns.get(ANN_ACTION_ID) == action.get("event_id") and ANN_EVICT_DEADLINE in anns:
            # Re-applied after a restart: keep the original deadline.
            deadline = datetime.strptime(anns[ANN_EVICT_DEADLINE], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        else:
            deadline = self.now() + timedelta(seconds=grace_s)
        return {ANN_EVICT_REASON: reason, ANN_CHECKPOINT: _iso(self.now()),
                ANN_EVICT_DEADLINE: _iso(deadline), ANN_ACTION_ID: action.get("event_id", "")}, deadline

    async def _signal_pods(self, pods: list[dict[str, Any]], signal: Mapping[str, str]) -> int:
        """Put the eviction's annotations on the live pods; the workload sees them through a
        downward API volume and can checkpoint before the grace period ends."""
        signalled = 0
        for pod in pods:
            if _ended(pod):
                continue
            try:
                await self.kube.request(
                    "PATCH", resource_path("", "v1", "pods", pod["metadata"]["namespace"], pod["metadata"]["name"]),
                    body={"metadata": {"annotations": dict(signal)}}, content_type="application/merge-patch+json")
                signalled += 1
            except KubeError as e:
                if e.status != 404:
                    raise
        return signalled

    async def _wait_until(self, deadline: datetime) -> None:
        wait_s = (deadline - self.now()).total_seconds()
        if wait_s > 0:
            await self.sleep(wait_s)

    async def _evict(self, action: Mapping[str, Any], p: Mapping[str, Any]) -> tuple[str, str, dict]:
        job = await self._get_job(p)
        if job is None:
            vcjob = await self._get_volcano_job(p)
            if vcjob is None:
                return NOT_FOUND, "job not found", {}
            return await self._evict_volcano(action, p, vcjob)
        if job["spec"].get("suspend", False):
            return ALREADY_APPLIED, "job already suspended", {}
        reason = p.get("reason") or "Preempted"
        grace_s = float(p.get("grace_period_s", 30))
        anns = job["metadata"].get("annotations") or {}
        signal, deadline = self._evict_signal(action, reason, grace_s, anns)
        if anns.get(ANN_ACTION_ID) != action.get("event_id"):
            await self.kube.request("PATCH", self._job_path(p), body={"metadata": {"annotations": signal}},
                                    content_type="application/merge-patch+json")
        pods = await self.kube.get(resource_path("", "v1", "pods", p["namespace"]),
                                   labelSelector=f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}")
        signalled = await self._signal_pods(pods.get("items") or [], signal)
        await self._wait_until(deadline)
        # Suspend (re-read: the Job may have changed while we waited). The Job controller then
        # deletes the pods.
        while True:
            job = await self._get_job(p)
            if job is None:
                return NOT_FOUND, "job deleted during the grace period", {}
            if job["spec"].get("suspend", False):
                break
            job["spec"]["suspend"] = True
            try:
                await self._put_job(job)
                break
            except _Conflict:
                continue
        restored = await self._restore_after_suspend(p)
        return APPLIED, f"suspended after {grace_s:g}s grace ({reason})", {
            "grace_period_s": grace_s, "signalled_pods": signalled, "scheduling_restored": restored}

    async def _admit_volcano(self, action: Mapping[str, Any], p: Mapping[str, Any],
                             vcjob: dict[str, Any]) -> tuple[str, str, dict]:
        """Record where the Volcano Job was admitted, then release its held pods there."""
        if not self._held_by_gates(vcjob):
            return NOT_FOUND, _UNHELD, dict(_ON_VOLCANO)
        flavor = self._placement(p)
        pinned: dict[str, Any] = {"nodeSelector": dict(flavor.node_labels),
                                  "tolerations": [dict(t) for t in flavor.tolerations]}
        if p.get("counts"):  # partial admission: so many pods of each task, the others held
            pinned["counts"] = dict(p["counts"])
        placement = orjson.dumps(pinned).decode()
        anns = vcjob["metadata"].get("annotations") or {}
        recorded = anns.get(ANN_ADMITTED_PLACEMENT) == placement
        if not recorded or anns.get(ANN_ACTION_ID) != action.get("event_id"):
            await self.kube.request(
                "PATCH", resource_path(*VOLCANO, p["namespace"], p["name"]),
                body={"metadata": {"annotations": {
                    ANN_ADMITTED_FLAVOR: flavor.name, ANN_ADMITTED_PLACEMENT: placement,
                    ANN_ACTION_ID: action.get("event_id", ""),
                    ANN_EVICT_REASON: None, ANN_CHECKPOINT: None, ANN_EVICT_DEADLINE: None}}},
                content_type="application/merge-patch+json")
        pods = await self._volcano_pods(vcjob)
        released = 0
        for pod in sorted(pods, key=_pod_order):
            if self._within_counts(pod, pods, pinned) and await self._release(pod, pinned):
                released += 1
                pod.setdefault("spec", {})["schedulingGates"] = []  # the pods after it count it as released
        held = sum(1 for pod in pods if admission_gated(pod))
        details = {"flavor": flavor.name, "node_selector": dict(flavor.node_labels), "released_pods": released,
                   "held_pods": held, **_ON_VOLCANO}
        if recorded and not released:
            return ALREADY_APPLIED, f"already admitted to {flavor.name}", details
        partially = (f"; {held} stay held, beyond the {pinned['counts']} pods a task the quota holds "
                     "(partial admission)") if "counts" in pinned else ""
        return APPLIED, (f"released {released} held pod(s) of the Volcano Job with flavor {flavor.name}; "
                         f"pods it makes later are released as they come{partially}"), details

    @staticmethod
    def _within_counts(pod: Mapping[str, Any], pods: list[dict[str, Any]], placement: Mapping[str, Any]) -> bool:
        """Whether a held pod may be released: always, unless the Job was admitted partially and
        its task already runs as many pods as the quota holds (or its task cannot be told)."""
        if not admission_gated(pod):
            return False
        counts = placement.get("counts")
        if not counts:
            return True
        task = _task_of(pod)
        if task is None:
            log.warning("pod %s names no Volcano task (%s): held, since the Job was admitted partially",
                        pod["metadata"].get("name"), VOLCANO_TASK)
            return False
        if task not in counts:
            return True  # admitted whole
        live = sum(1 for other in pods if other is not pod and _task_of(other) == task
                   and not admission_gated(other) and not _ended(other))
        return live < counts[task]

    async def _evict_volcano(self, action: Mapping[str, Any], p: Mapping[str, Any],
                             vcjob: dict[str, Any]) -> tuple[str, str, dict]:
        """Take the admission back first (pods made from now on stay held), signal the live
        pods, and delete them after the grace period; Volcano makes them again, held."""
        if not self._held_by_gates(vcjob):
            return NOT_FOUND, _UNHELD, dict(_ON_VOLCANO)
        anns = vcjob["metadata"].get("annotations") or {}
        live = [pod for pod in await self._volcano_pods(vcjob) if not admission_gated(pod) and not _ended(pod)]
        if ANN_ADMITTED_PLACEMENT not in anns and not live:
            return ALREADY_APPLIED, "Volcano Job already held", dict(_ON_VOLCANO)
        reason = p.get("reason") or "Preempted"
        grace_s = float(p.get("grace_period_s", 30))
        signal, deadline = self._evict_signal(action, reason, grace_s, anns)
        await self.kube.request(
            "PATCH", resource_path(*VOLCANO, p["namespace"], p["name"]),
            body={"metadata": {"annotations": {**signal, ANN_ADMITTED_FLAVOR: None, ANN_ADMITTED_PLACEMENT: None}}},
            content_type="application/merge-patch+json")
        signalled = await self._signal_pods(live, signal)
        await self._wait_until(deadline)
        deleted = 0
        for pod in await self._volcano_pods(vcjob):
            if admission_gated(pod) or _ended(pod):
                continue
            try:
                await self.kube.request("DELETE", resource_path("", "v1", "pods", p["namespace"],
                                                                pod["metadata"]["name"]))
                deleted += 1
            except KubeError as e:
                if e.status != 404:
                    raise
        return APPLIED, (f"held after {grace_s:g}s grace ({reason}): {deleted} running pod(s) deleted; Volcano "
                         f"makes them again, held until the Job is admitted again"), {
            "grace_period_s": grace_s, "signalled_pods": signalled, "deleted_pods": deleted, **_ON_VOLCANO}

    async def _restore_after_suspend(self, p: Mapping[str, Any]) -> bool:
        """Put back the template's own nodeSelector/tolerations after stopping a Job, as Kueue
        does: the API server lets a Job's template scheduling fields change only while it is
        suspended *and* has no status.startTime, so first clear startTime (status subresource),
        then restore the template. Each step re-reads and retries on conflict."""
        while True:
            job = await self._get_job(p)
            if job is None or not job["spec"].get("suspend", False):
                return False  # deleted or re-admitted meanwhile: nothing to restore
            if (job.get("status") or {}).get("startTime") is None:
                break
            job["status"].pop("startTime", None)
            try:
                await self.kube.request("PUT", self._job_path(job["metadata"]) + "/status", body=job)
                break
            except KubeError as e:
                if e.status != 409:
                    raise
        while True:
            job = await self._get_job(p)
            if job is None or not job["spec"].get("suspend", False):
                return False
            if not self._restore_scheduling(job):
                return True
            try:
                await self._put_job(job)
                return True
            except _Conflict:
                continue

    @staticmethod
    def _restore_scheduling(job: dict[str, Any]) -> bool:
        """Modify ``job`` to carry its pre-admission scheduling fields; False if nothing to do."""
        anns = job["metadata"].setdefault("annotations", {})
        original = anns.pop(ANN_ORIGINAL_SCHEDULING, None)
        anns.pop(ANN_ADMITTED_FLAVOR, None)
        if original is None:
            return False
        o = orjson.loads(original)
        pod_spec = job["spec"]["template"].setdefault("spec", {})
        # (annotations written before partial admission have no parallelism: left as it is)
        for fields, k in ((pod_spec, "nodeSelector"), (pod_spec, "tolerations"), (job["spec"], "parallelism")):
            if k not in o:
                continue
            if o[k] is None:
                fields.pop(k, None)
            else:
                fields[k] = o[k]
        return True

    async def _cleanup(self, action: Mapping[str, Any], p: Mapping[str, Any]) -> tuple[str, str, dict]:
        job = await self._get_job(p)
        path, on = self._job_path(p), {}
        if job is None:
            job = await self._get_volcano_job(p)
            path, on = resource_path(*VOLCANO, p["namespace"], p["name"]), dict(_ON_VOLCANO)
        if job is None:
            return ALREADY_APPLIED, "job already deleted", {}
        try:
            await self.kube.request(
                "DELETE", path,
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                      "preconditions": {"uid": job["metadata"]["uid"]}})
        except KubeError as e:
            if e.status == 404:
                return ALREADY_APPLIED, "job already deleted", on
            raise
        return APPLIED, "deleted", on

    async def _record_event(self, p: Mapping[str, Any], etype: str, outcome: str, message: str,
                            api_version: str = "batch/v1") -> None:
        """Also record the outcome as a Kubernetes Event on the Job, for kubectl describe."""
        if not p.get("namespace") or not p.get("name"):
            return
        now = self.now()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{p['name']}.qm-", "namespace": p["namespace"]},
            "involvedObject": {"apiVersion": api_version, "kind": "Job", "name": p["name"],
                               "namespace": p["namespace"], "uid": p.get("workload_uid")},
            "reason": {ADMIT: "QuartermasterAdmitted", EVICT: "QuartermasterEvicted",
                       CLEANUP: "QuartermasterCleanedUp"}.get(etype, "QuartermasterAction"),
            "message": f"{outcome}: {message}"[:1024],
            "type": "Normal" if outcome in (APPLIED, ALREADY_APPLIED) else "Warning",
            "firstTimestamp": _iso(now), "lastTimestamp": _iso(now), "count": 1,
            "source": {"component": "quartermaster-watcher"},
        }
        try:
            await self.kube.request("POST", resource_path("", "v1", "events", p["namespace"]), body=body)
        except (KubeError, OSError) as e:  # best effort: the bus event is the record
            log.warning("could not record event: %s", e)
