"""How a queued workload without a suspend is held (ADR 0068): the scheduling gate the
admission webhook puts on a Volcano Job's pods, and the watcher lifts once the Job is admitted.
Both read a pod with these, so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ADMISSION_GATE = "quartermaster.dev/admission"
VOLCANO_GROUP = "batch.volcano.sh"


def admission_gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod waits for Quartermaster's admission (its scheduling gate)."""
    return any(g.get("name") == ADMISSION_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def volcano_owner(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, name) of the Volcano Job that controls the pod, or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if (ref.get("controller") and ref.get("kind") == "Job"
                and str(ref.get("apiVersion", "")).startswith(VOLCANO_GROUP + "/")):
            return ref.get("uid", ""), ref.get("name", "")
    return None
