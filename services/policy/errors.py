"""Errors of the policy layer.

A policy that cannot be loaded is a broken input, so it raises `PolicyError`
naming the file, the object and the field. A workload that breaks a rule is
*not* an error: it is an `AdmissionDecision` with violations.
"""

from __future__ import annotations


class PolicyError(Exception):
    """An invalid policy document: names the file, the object and the field."""

    def __init__(self, file: str, obj: str, field: str, reason: str) -> None:
        self.file = file
        self.obj = obj
        self.field = field
        self.reason = reason
        super().__init__(f"{file}: {obj}: {field}: {reason}")
