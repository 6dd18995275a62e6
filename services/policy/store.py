"""The active policy set, swapped atomically; an invalid reload keeps the previous set."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from services.policy.errors import PolicyError
from services.policy.loader import PolicySet


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    version: str
    error: PolicyError | None = None


class PolicyStore:
    """Holds the current `PolicySet`. `current()` is the provider the webhook takes."""

    def __init__(self, initial: PolicySet | None = None) -> None:
        self._current = initial or PolicySet()
        self._loaded = initial is not None
        self.last_error: PolicyError | None = None

    def current(self) -> PolicySet:
        return self._current

    @property
    def loaded(self) -> bool:
        return self._loaded

    def reload(self, paths: str | Path | Iterable[str | Path]) -> ReloadResult:
        try:
            new = PolicySet.load(paths)
        except PolicyError as e:
            self.last_error = e
            return ReloadResult(False, self._current.version, e)
        self._current, self._loaded, self.last_error = new, True, None
        return ReloadResult(True, new.version)

    def replace(self, policy_set: PolicySet) -> None:
        self._current, self._loaded = policy_set, True
