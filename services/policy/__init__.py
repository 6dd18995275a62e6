"""Policy as code for Quartermaster: Gatekeeper CEL templates and Quartermaster policies.

A shared layer, not a service: the admission service (bus and webhook) and the `qm policy`
CLI both use it.

    policy_set = PolicySet.load(["policies/"])          # PolicyError(file, object, field)
    decision = evaluate(policy_set, job, namespace_object, usage, budget, cluster, "CREATE")
    decision.allowed, decision.violations, decision.warnings
"""

from services.policy.errors import PolicyError
from services.policy.evaluate import AdmissionDecision, Violation, evaluate, placement_sensitive
from services.policy.loader import PolicySet
from services.policy.model import EnforcementAction, EnforcementPoint
from services.policy.store import PolicyStore

__all__ = [
    "AdmissionDecision",
    "EnforcementAction",
    "EnforcementPoint",
    "PolicyError",
    "PolicySet",
    "PolicyStore",
    "Violation",
    "evaluate",
    "placement_sensitive",
]
