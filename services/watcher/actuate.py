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
        await self._record_event(p, etype, outcome, message)
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

    async def _not_found(self, p: Mapping[str, Any]) -> str:
        """Why an Admit or Evict found no batch/v1 Job: gone, or the workload is a Volcano Job,
        which the watcher observes (the queue-manager queues it, the cost service bills it) but
        cannot hold: batch.volcano.sh Jobs have no suspend. Listed by name, which the watcher's
        list/watch permission allows where a get would need one more verb."""
        try:
            found = await self.kube.get(resource_path("batch.volcano.sh", "v1alpha1", "jobs", p["namespace"]),
                                        fieldSelector=f"metadata.name={p['name']}")
        except KubeError:
            return "job not found"  # Volcano's CRD not served, or not readable: nothing more to say
        if not any(j["metadata"].get("uid") == p.get("workload_uid") for j in found.get("items") or []):
            return "job not found"
        return ("a Volcano Job (batch.volcano.sh/v1alpha1): Quartermaster judges, queues and bills it, but holds, "
                "pins and stops batch/v1 Jobs only; a Volcano Job has no suspend, so Volcano's scheduler runs it "
                "whatever this action said")

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
            return NOT_FOUND, await self._not_found(p), {}
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

    async def _evict(self, action: Mapping[str, Any], p: Mapping[str, Any]) -> tuple[str, str, dict]:
        job = await self._get_job(p)
        if job is None:
            return NOT_FOUND, await self._not_found(p), {}
        if job["spec"].get("suspend", False):
            return ALREADY_APPLIED, "job already suspended", {}
        reason = p.get("reason") or "Preempted"
        grace_s = float(p.get("grace_period_s", 30))
        anns = job["metadata"].get("annotations") or {}
        if anns.get(ANN_ACTION_ID) == action.get("event_id") and ANN_EVICT_DEADLINE in anns:
            # Re-applied after a restart: keep the original deadline.
            deadline = datetime.strptime(anns[ANN_EVICT_DEADLINE], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        else:
            deadline = self.now() + timedelta(seconds=grace_s)
        signal = {ANN_EVICT_REASON: reason, ANN_CHECKPOINT: _iso(self.now()),
                  ANN_EVICT_DEADLINE: _iso(deadline), ANN_ACTION_ID: action.get("event_id", "")}
        if anns.get(ANN_ACTION_ID) != action.get("event_id"):
            await self.kube.request("PATCH", self._job_path(p), body={"metadata": {"annotations": signal}},
                                    content_type="application/merge-patch+json")
        # The workload sees the signal through its pods (downward API volume of annotations).
        pods = await self.kube.get(resource_path("", "v1", "pods", p["namespace"]),
                                   labelSelector=f"batch.kubernetes.io/controller-uid={job['metadata']['uid']}")
        signalled = 0
        for pod in pods.get("items") or []:
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                await self.kube.request(
                    "PATCH", resource_path("", "v1", "pods", p["namespace"], pod["metadata"]["name"]),
                    body={"metadata": {"annotations": signal}}, content_type="application/merge-patch+json")
                signalled += 1
            except KubeError as e:
                if e.status != 404:
                    raise
        wait_s = (deadline - self.now()).total_seconds()
        if wait_s > 0:
            await self.sleep(wait_s)
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
        if job is None:
            return ALREADY_APPLIED, "job already deleted", {}
        try:
            await self.kube.request(
                "DELETE", self._job_path(p),
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background",
                      "preconditions": {"uid": job["metadata"]["uid"]}})
        except KubeError as e:
            if e.status == 404:
                return ALREADY_APPLIED, "job already deleted", {}
            raise
        return APPLIED, "deleted", {}

    async def _record_event(self, p: Mapping[str, Any], etype: str, outcome: str, message: str) -> None:
        """Also record the outcome as a Kubernetes Event on the Job, for kubectl describe."""
        if not p.get("namespace") or not p.get("name"):
            return
        now = self.now()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{p['name']}.qm-", "namespace": p["namespace"]},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": p["name"],
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
