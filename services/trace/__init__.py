"""Trace drivers: the Alibaba GPU trace (and a synthetic look-alike) as ordered event streams.

Not core (reads files); shared by replay tests, the demo and the benchmarks.
"""

from services.trace.alibaba import (
    DEFAULT_BASE_EPOCH_S,
    TEAM_COST_CENTERS,
    TEAM_NAMESPACES,
    TraceEvent,
    TraceEventKind,
    TraceNode,
    TracePod,
    WorkloadClass,
    flavor_for,
    lifecycle_events,
    namespace_for,
    read_nodes,
    read_pods,
    trace_end_s,
    workload_class_for,
)
from services.trace.synthetic import synthetic_pods, write_pod_csv

__all__ = [
    "DEFAULT_BASE_EPOCH_S",
    "TEAM_COST_CENTERS",
    "TEAM_NAMESPACES",
    "TraceEvent",
    "TraceEventKind",
    "TraceNode",
    "TracePod",
    "WorkloadClass",
    "flavor_for",
    "lifecycle_events",
    "namespace_for",
    "read_nodes",
    "read_pods",
    "synthetic_pods",
    "trace_end_s",
    "workload_class_for",
    "write_pod_csv",
]
