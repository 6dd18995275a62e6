"""Admission's fact lane: lifecycle facts onto the cohort's stream without queueing behind the
submissions (ADR 0026).

Admission reads `qm.cluster` twice, in two consumer groups:
* its faust agent (group `qm-admission`) judges submissions, one policy evaluation each;
* this lane (group `qm-admission-facts`) forwards pod running / finished, workload finished and
  node capacity (cohort_stream, ADR 0023) and passes over everything else. Since ADR 0075 the
  watcher sends a queued workload's pod and workload facts to the cohort's stream itself, so
  the lane forwards node capacity and what a source could not route (a queue its config did
  not know yet; a producer without a config).

In one agent, a burst of submissions held every pod fact behind it: in kueue-large-scale the
queue-manager learnt of finishes 8-13 s late, preempted workloads that had already finished
and requeued them. A fact can only concern a workload that admission has judged already (its
pod runs after the queue-manager admitted it), so the two lanes need no order between them.

At-least-once: a partition's offset is committed once the facts forwarded from it are
acknowledged, at most once per QM_FACT_LANE_COMMIT_S (default 1 s; and before a revocation or a
stop); a fact forwarded twice (a crash, a rebalance) keeps its event id, and the readers of
qm.workloads skip the second copy. Committing after every fetch was a commit request, and a
record in the broker's offsets log, per handful of facts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import OffsetAndMetadata
from prometheus_client import Counter

from services.adapters.bus import TypeMarkers
from services.adapters.cohort_stream import FORWARDED, UnknownQueue
from services.adapters.runtime import Output
from services.contracts.codec import ContractError, Envelope, from_document, parse

log = logging.getLogger("qm.admission.facts")
FACTS = Counter("qm_admission_facts_total", "qm.cluster facts the fact lane read, by outcome",
                ["outcome"])  # forwarded | unroutable (no configured queue) | dead-lettered
# Bound once: `labels()` looks its child up anew at every call, ~1% of admission's samples.
FORWARDED_FACTS, UNROUTABLE_FACTS, DEAD_LETTERED_FACTS = (FACTS.labels(outcome) for outcome in
                                                          ("forwarded", "unroutable", "dead-lettered"))

WANTED = frozenset(record.EVENT_TYPE for record in FORWARDED)
WANTED_MARKERS = TypeMarkers(WANTED)
MAX_RECORDS = 1000  # per round: a round's facts are acknowledged together before its commit
try:
    COMMIT_EVERY_S = float(os.environ.get("QM_FACT_LANE_COMMIT_S", 1.0))
except ValueError:
    raise SystemExit("admission: QM_FACT_LANE_COMMIT_S must be a number of seconds (1 by default; 0 = "
                     f"commit after every fetch), not {os.environ['QM_FACT_LANE_COMMIT_S']!r}") from None


class FactLane:
    """Reads `topic` in consumer group `group`, sends `route(envelope)` for every forwarded fact
    through `send`, and commits what it has forwarded.

    A record of a fact's type that fails its schema goes to `dead_letter(record, error, kind)`
    (kind "contract"): the faust agent passes facts over unvalidated, so nobody else would. One
    that `route` fails on goes there too (kind "handler"), as in the faust agents.

    A partition it has never committed starts at the beginning, or, with `takeover_group`,
    where that group's commit is: for an upgrade from a version whose faust agent forwarded the
    facts (QM_FACT_LANE_TAKEOVER_GROUP=qm-admission, set for the first start only), so the
    topic's history is not forwarded again. Not by default: the new agent commits in that group
    too, and facts below its commit would be skipped."""

    def __init__(self, bootstrap: str, topic: str, group: str, route: Callable[[Envelope], list[Output]],
                 send: Callable[[list[Output]], Awaitable[None]],
                 dead_letter: Callable[[Any, str, str], Awaitable[None]], *, takeover_group: str | None = None,
                 fetch_max_wait_ms: int = 100, fetch_min_bytes: int = 1) -> None:
        self.bootstrap, self.topic, self.group, self.takeover_group = bootstrap, topic, group, takeover_group
        self.route, self.send, self.dead_letter = route, send, dead_letter
        self.fetch_max_wait_ms, self.fetch_min_bytes = fetch_max_wait_ms, fetch_min_bytes
        self.joined = asyncio.Event()  # set at its first partition assignment (admission's /readyz waits)
        self.forwarded = 0  # records sent (a running pod is two: pod.running and workload.running)
        self.stopped = 0  # Evicts sent for running pods of Jobs in no LocalQueue (ADR 0065)
        self.unroutable = 0  # facts about workloads in no configured queue (logged, not sent)

    async def run(self) -> None:
        await self._seed_from_takeover_group()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False,
            auto_offset_reset="earliest", fetch_max_wait_ms=self.fetch_max_wait_ms,
            fetch_min_bytes=self.fetch_min_bytes,
        )
        await consumer.start()
        uncommitted: dict[TopicPartition, int] = {}  # next offset per partition, forwarded up to it

        async def commit_revoked(revoked) -> None:
            await self._commit(consumer, {tp: uncommitted.pop(tp) for tp in revoked if tp in uncommitted})

        consumer.subscribe([self.topic], listener=_Joined(self.joined, commit_revoked))
        committed_at = time.monotonic()
        try:
            while True:
                batch = await consumer.getmany(timeout_ms=500, max_records=MAX_RECORDS)
                outputs: list[Output] = []
                for records in batch.values():
                    for record in records:
                        outputs += await self._facts(record)
                if outputs:
                    await self.send(outputs)  # acknowledged by the broker before the commit
                    stops = sum(1 for o in outputs if o.topic == "qm.actions")
                    self.forwarded += len(outputs) - stops
                    self.stopped += stops
                uncommitted.update({tp: records[-1].offset + 1 for tp, records in batch.items() if records})
                if uncommitted and time.monotonic() - committed_at >= COMMIT_EVERY_S:
                    await self._commit(consumer, uncommitted)
                    uncommitted.clear()
                    committed_at = time.monotonic()
        finally:
            try:
                if uncommitted:
                    await self._commit(consumer, uncommitted)
            except KafkaError as error:  # stopping anyway: these facts are forwarded again
                log.info("fact lane could not commit on its way out: %s", error)
            finally:
                await consumer.stop()

    async def _facts(self, record) -> list[Output]:
        if not WANTED_MARKERS.named_in(record.value):
            return []  # names no fact type, so it is no fact: passed over unparsed (submissions)
        try:
            document = parse(record.value)
        except ContractError:
            return []  # not JSON: the faust agent reads the same record and dead-letters it
        if not isinstance(document, dict) or document.get("event_type") not in WANTED:
            return []  # not a fact; what nobody can read is the faust agent's to dead-letter
        try:
            envelope = from_document(document)
        except ContractError as error:  # a fact only this lane validates: dead-lettered here
            DEAD_LETTERED_FACTS.inc()
            await self.dead_letter(record, f"contract: {error}", "contract")
            return []
        try:
            outputs = self.route(envelope)
            FORWARDED_FACTS.inc()
            return outputs
        except UnknownQueue as error:
            self.unroutable += 1
            UNROUTABLE_FACTS.inc()
            stopping = "; its Job is stopped (NotAdmitted)" if error.stops else ""
            log.warning("lifecycle event for a workload in no known queue; not forwarded%s: %s (event %s)",
                        stopping, error, envelope.event_id)
            return error.stops
        except Exception as error:  # noqa: BLE001 - a routing bug must not stop the lane (as in the agents)
            log.exception("fact lane: routing failed; record dead-lettered (event %s)", envelope.event_id)
            DEAD_LETTERED_FACTS.inc()
            await self.dead_letter(record, f"handler: {type(error).__name__}: {error}", "handler")
            return []

    @staticmethod
    async def _commit(consumer: AIOKafkaConsumer, offsets: dict[TopicPartition, int]) -> None:
        owned = consumer.assignment()
        offsets = {tp: o for tp, o in offsets.items() if tp in owned}
        if not offsets:
            return
        try:
            await consumer.commit(offsets)
        except CommitFailedError as error:  # a rebalance took the partition: its new owner forwards again
            log.info("fact lane commit refused after a rebalance (the facts are forwarded again): %s", error)

    async def _seed_from_takeover_group(self) -> None:
        """Before joining: commit, in this lane's group, the takeover group's offset of every
        partition this lane has never committed. (Seeking in a rebalance listener came too late:
        the first fetch from the beginning was already under way.)"""
        if not self.takeover_group:
            return
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            own = await admin.list_consumer_group_offsets(self.group)
            theirs = await admin.list_consumer_group_offsets(self.takeover_group)
        finally:
            await admin.close()
        seeds = {tp: meta.offset for tp, meta in theirs.items()
                 if tp.topic == self.topic and meta.offset >= 0 and own.get(tp, _NONE).offset < 0}
        if not seeds:
            return
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(list(seeds))
            await consumer.commit(seeds)
            log.info("fact lane starts where %s stopped: %s", self.takeover_group,
                     {tp.partition: offset for tp, offset in sorted(seeds.items())})
        except KafkaError as error:  # another replica's lane is in the group already: it seeded it
            log.warning("fact lane could not take over %s's offsets (%s)", self.takeover_group, error)
        finally:
            await consumer.stop()


_NONE = OffsetAndMetadata(-1, "")


class _Joined(ConsumerRebalanceListener):
    def __init__(self, joined: asyncio.Event, commit_revoked: Callable[[Any], Awaitable[None]]) -> None:
        self.joined, self.commit_revoked = joined, commit_revoked

    async def on_partitions_revoked(self, revoked) -> None:
        await self.commit_revoked(revoked)  # what was forwarded from them, before they move

    async def on_partitions_assigned(self, assigned) -> None:
        self.joined.set()  # also with no partition: more replicas than partitions


async def run_forever(lane: FactLane, retry_s: float = 2.0) -> None:
    """The lane, restarted after an error (at-least-once: it resumes at its commits). A lane
    that stopped would leave the facts unforwarded while the service looked healthy."""
    while True:
        try:
            await lane.run()
        except asyncio.CancelledError:
            raise
        except (KafkaError, OSError) as error:
            log.warning("fact lane stopped (%s); restarting in %.0f s", error, retry_s)
        except Exception:  # noqa: BLE001 - whatever it was, forwarding must go on
            log.exception("fact lane failed; restarting in %.0f s", retry_s)
        await asyncio.sleep(retry_s)
