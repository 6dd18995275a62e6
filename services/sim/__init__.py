"""The trace-driven cluster simulator: stands in for the watcher when no cluster is given.

Submits workloads from a trace (the Alibaba GPU trace or its synthetic look-alike), answers
qm.actions like a cluster (pods run and finish after their trace durations, evicted pods stop
after their grace period), and moves event time with clock ticks, compressed by ``speed``.
"""

from services.sim.config import (
    build_kueue_objects,
    cluster_queue_name,
    local_queue_name,
    synthetic_nodes,
    write_kueue_config,
)
from services.sim.runner import SimStats, Simulator, load_trace, run_simulation
from services.sim.workloads import SIM_EPOCH, Compression, SimWorkload, workloads_from_trace

__all__ = [
    "SIM_EPOCH",
    "Compression",
    "SimStats",
    "SimWorkload",
    "Simulator",
    "build_kueue_objects",
    "cluster_queue_name",
    "load_trace",
    "local_queue_name",
    "run_simulation",
    "synthetic_nodes",
    "workloads_from_trace",
    "write_kueue_config",
]
