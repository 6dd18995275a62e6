"""Cluster facts onto the cohort's stream (ADR 0009, 0023, 0075).

Pure: one cluster fact -> the qm.workloads records that carry it under the cohort key, so
every reader of qm.workloads (the queue-manager's fold, cost-accounting) sees one cohort's
story in one order. Two places put facts there:
* the fact's source, the watcher (and the simulated cluster), for the pod and workload facts of
  a workload in a queue it knows (`FactRouter`, ADR 0075): one hop, and no second copy;
* admission's fact lane, for everything else that reaches qm.cluster: node capacity, and facts
  from a source that could not route them (ADR 0023, 0026), so a Job in no LocalQueue is
  still stopped there (ADR 0065).

* pod.running.v1 / pod.finished.v1 travel as they are (cost bills pods that start at
  different times); the running one also becomes workload.running.v1 for the fold (the fold
  counts the first).
* workload.finished.v1 travels as it is.
* node.capacity.v1 goes to every cohort key: each cohort places its own workloads on the nodes.

Event ids derive from the source event's id and the record type alone (not from who
forwards), so the same fact routed at its source and forwarded by admission (an upgrade, a
config the two saw differently) is one event to every reader.
"""

from __future__ import annotations

from services.adapters.kueue_config import KueueConfig
from services.adapters.runtime import Output
from services.contracts.codec import Envelope, make_envelope
from services.contracts.events import (
    ActionEvict,
    NodeCapacity,
    PodFinished,
    PodRunning,
    WorkloadFinished,
    WorkloadRunning,
)

PRODUCER = "admission"
#: The qm.cluster records that join the cohort's stream.
FORWARDED = (PodRunning, PodFinished, WorkloadFinished, NodeCapacity)


class UnknownQueue(LookupError):
    """A lifecycle fact about a workload whose queue the configuration does not know. `stops`
    holds the Evict for a running pod of a Job that names a LocalQueue (ADR 0065)."""

    def __init__(self, message: str, stops: list[Output] | None = None) -> None:
        super().__init__(message)
        self.stops = stops or []


def stop_outside_every_queue(envelope: Envelope) -> list[Output]:
    """The Evict (reason NotAdmitted, no grace) for a pod that runs while its Job names a
    LocalQueue that does not exist: nothing will admit it, and Kueue's reconciler stops every
    queue-labelled Job it has not admitted (ADR 0065). The queue-manager never sees such a
    workload (it is on no cohort's stream), so admission, which judged it "not in any
    LocalQueue", stops it. [] for other facts, and for pods of Jobs without the label, which
    are none of ours. One per pod start (its id from the fact's), so a fact forwarded twice
    stops once."""
    payload = envelope.payload
    if not isinstance(payload, PodRunning) or not payload.queue_name:
        return []
    stop = ActionEvict(workload_uid=payload.workload_uid, namespace=payload.namespace,
                       name=payload.workload_name or payload.workload_uid, kind="Job",
                       reason=ActionEvict.NOT_ADMITTED, grace_period_s=0)
    return [Output("qm.actions", payload.workload_uid,
                   make_envelope(stop, producer=PRODUCER, occurred_at=envelope.occurred_at,
                                 identity=(envelope.event_id, "stopped"), cause=envelope))]


def cohort_stream_outputs(envelope: Envelope, config: KueueConfig, producer: str = PRODUCER) -> list[Output]:
    """The qm.workloads records for one cluster fact ([] for facts no cohort reads), produced
    by `producer`. Raises UnknownQueue when the workload's LocalQueue / ClusterQueue is not
    configured."""
    payload = envelope.payload
    if isinstance(payload, NodeCapacity):
        return [
            Output("qm.workloads", key, make_envelope(payload, producer=producer, occurred_at=envelope.occurred_at,
                                                      identity=(envelope.event_id, key), cause=envelope))
            for key in config.cohort_keys()
        ]
    if isinstance(payload, PodRunning | PodFinished):
        key = config.routing_key(payload.namespace, payload.queue_name)
        forwarded = [payload]
        if isinstance(payload, PodRunning):
            forwarded.append(WorkloadRunning(
                uid=payload.workload_uid, namespace=payload.namespace,
                name=payload.workload_name or payload.workload_uid, started_at=payload.started_at))
    elif isinstance(payload, WorkloadFinished):
        key = config.routing_key(payload.namespace, payload.queue_name, payload.cluster_queue)
        forwarded = [payload]
    else:
        return []
    if key is None:
        raise UnknownQueue(f"{envelope.event_type} {envelope.event_id}: namespace {payload.namespace!r}, "
                           f"queue {getattr(payload, 'queue_name', None)!r} is in no configured LocalQueue",
                           stop_outside_every_queue(envelope))
    return [
        Output("qm.workloads", key, make_envelope(p, producer=producer, occurred_at=envelope.occurred_at,
                                                  identity=(envelope.event_id, "rekeyed", p.EVENT_TYPE),
                                                  cause=envelope))
        for p in forwarded
    ]


#: The facts their source puts on the cohort's stream itself (ADR 0075). Node capacity is not
#: among them: the replicas read it on qm.cluster, and admission sends it to every cohort.
ROUTED_AT_SOURCE = frozenset(t.EVENT_TYPE for t in (PodRunning, PodFinished, WorkloadFinished))


class FactRouter:
    """The source's half of ADR 0075: the pod and workload facts of a workload in a configured
    queue go straight onto its cohort's stream, as admission's fact lane would have put them
    there (the same records, the same event ids), instead of onto qm.cluster for the lane to
    read, re-key and send again. In kueue-baseline that second trip cost a fifth of a small
    job's CPU.

    `outputs()` answers None for everything else, which goes to qm.cluster as before: the lane
    forwards node capacity, and a fact about a queue this config does not know (a LocalQueue
    added since, or none: admission stops such a Job, ADR 0065). `config` is replaced when a
    new set is applied (`qm config publish`), as admission's is."""

    def __init__(self, config: KueueConfig, producer: str) -> None:
        self.config, self.producer = config, producer

    def outputs(self, envelope: Envelope) -> list[Output] | None:
        if envelope.event_type not in ROUTED_AT_SOURCE:
            return None
        try:
            return cohort_stream_outputs(envelope, self.config, self.producer) or None
        except UnknownQueue:
            return None
