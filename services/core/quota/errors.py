"""Exceptions of the quota core. A "no" is a Decision, never an exception: these are for input
that cannot be understood (invalid configuration) and broken invariants."""

from __future__ import annotations


class QuotaError(Exception):
    """Root of the quota core's exceptions."""


class ConfigError(QuotaError):
    """Invalid Kueue object. Names the file, the object and the field."""

    def __init__(self, source: str, obj: str, field: str, problem: str) -> None:
        self.source = source
        self.obj = obj
        self.field = field
        self.problem = problem
        super().__init__(f"{source}: {obj}: {field}: {problem}")


class UnknownWorkloadError(QuotaError, KeyError):
    """A workload key is not admitted in the snapshot."""
