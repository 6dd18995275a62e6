"""The cost service's configuration, read once at start from ``QM_CONFIG_DIR`` (GitOps YAML).

Recognized objects (``apiVersion: quartermaster.dev/v1alpha1``); every other object in the
directory (Kueue, Gatekeeper, …) is skipped:

* ``PriceList`` — at most one; parsed by :func:`services.core.cost.price_list_from_dict`.
* ``Budget`` — any number; :func:`services.core.cost.budget_from_dict`.
* ``CostSettings`` — optional::

      apiVersion: quartermaster.dev/v1alpha1
      kind: CostSettings
      metadata: {name: default}
      spec:
        costCenterLabel: quartermaster.dev/cost-center   # the namespace label naming the cost center
        defaultCostCenter: unallocated
        closeDelaySeconds: 0          # an hour closes this long after event time passes its end
        correctionHorizonHours: 168   # late events may correct hours this far back
        billingAccountId: quartermaster

An invalid object raises :class:`CostConfigError` naming the file, the object and the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.contracts import yaml_documents
from services.core.cost import (
    Budget,
    CostConfigError,
    CostSettings,
    PriceList,
    budget_from_dict,
    price_list_from_dict,
)

API_VERSION = "quartermaster.dev/v1alpha1"

__all__ = ["CostConfig", "load_config", "config_from_documents"]


@dataclass(frozen=True, slots=True)
class CostConfig:
    settings: CostSettings = field(default_factory=CostSettings)
    price_list: PriceList | None = None
    budgets: tuple[Budget, ...] = ()


def _settings_from(doc: dict[str, Any], where: str) -> CostSettings:
    spec = doc.get("spec") or {}
    base = CostSettings()
    try:
        return CostSettings(
            cost_center_label=str(spec.get("costCenterLabel", base.cost_center_label)),
            default_cost_center=str(spec.get("defaultCostCenter", base.default_cost_center)),
            close_delay_ms=int(spec.get("closeDelaySeconds", base.close_delay_ms // 1000)) * 1000,
            correction_horizon_ms=int(spec.get("correctionHorizonHours", base.correction_horizon_ms // 3_600_000))
            * 3_600_000,
            billing_account_id=str(spec.get("billingAccountId", base.billing_account_id)),
            default_currency=base.default_currency,
        )
    except (TypeError, ValueError) as error:
        raise CostConfigError(where, "spec", str(error)) from None


def config_from_documents(documents: Iterable[tuple[str, Any]]) -> CostConfig:
    """``(source name, parsed YAML document)`` pairs → the config."""
    settings, price_list, budgets = CostSettings(), None, []
    for source, doc in documents:
        if not isinstance(doc, dict) or doc.get("apiVersion") != API_VERSION:
            continue
        kind = doc.get("kind")
        name = (doc.get("metadata") or {}).get("name", "?")
        try:
            if kind == "PriceList":
                if price_list is not None:
                    raise CostConfigError(f"PriceList/{name}", "metadata.name", "only one PriceList may be active")
                price_list = price_list_from_dict(doc)
            elif kind == "Budget":
                budgets.append(budget_from_dict(doc))
            elif kind == "CostSettings":
                settings = _settings_from(doc, f"CostSettings/{name}")
        except CostConfigError as error:
            raise CostConfigError(f"{source}: {error.obj}", error.field, error.message) from None
    if price_list is not None and settings.default_currency != price_list.currency:
        settings = CostSettings(
            cost_center_label=settings.cost_center_label,
            default_cost_center=settings.default_cost_center,
            close_delay_ms=settings.close_delay_ms,
            correction_horizon_ms=settings.correction_horizon_ms,
            billing_account_id=settings.billing_account_id,
            default_currency=price_list.currency,
        )
    return CostConfig(settings, price_list, tuple(sorted(budgets, key=lambda b: b.name)))


def load_config(directory: str | Path | None) -> CostConfig:
    """Every ``*.yaml``/``*.yml`` file of the directory (sorted); no directory → defaults."""
    if not directory:
        return CostConfig()
    root = Path(directory)
    if not root.is_dir():
        raise CostConfigError(str(root), "QM_CONFIG_DIR", "is not a directory")
    documents: list[tuple[str, Any]] = []
    for path in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        try:
            documents.extend((str(path), doc) for doc in yaml_documents.load_all(path.read_text()))
        except yaml.YAMLError as error:
            raise CostConfigError(str(path), "(yaml)", str(error)) from None
    return config_from_documents(documents)
