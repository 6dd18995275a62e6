"""Loading policies from YAML/JSON files and directories into an immutable `PolicySet`.

Recognised documents:

* `templates.gatekeeper.sh/v1` (and v1beta1) `ConstraintTemplate` whose
  `spec.targets[].code[]` has an `engine: K8sNativeValidation` entry (Rego is ignored
  when a CEL engine is present; a Rego-only template is refused);
* `constraints.gatekeeper.sh/*` constraints of a loaded template's kind;
* `quartermaster.dev/v1alpha1` `AdmissionPolicy`.

Other documents (example objects, `Suite` files, Namespaces) are skipped. Anything wrong
raises `PolicyError(file, object, field, reason)` and nothing is returned, so the caller's
previous set stays active (see `PolicyStore`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from services.contracts import yaml_documents
from services.policy.celenv import (
    PARAMS_BY_POLICY,
    PARAMS_OBJECT_BY_POLICY,
    CelCompileError,
    compile_expression,
    rewrite,
)
from services.policy.errors import PolicyError
from services.policy.match import parse_match
from services.policy.model import (
    SCOPED,
    EnforcementAction,
    Expression,
    Policy,
    ScopedAction,
    Template,
    Validation,
    Variable,
)

TEMPLATE_GROUP = "templates.gatekeeper.sh"
CONSTRAINT_GROUP = "constraints.gatekeeper.sh"
QM_API = "quartermaster.dev/v1alpha1"
QM_KIND = "AdmissionPolicy"
CEL_ENGINE = "K8sNativeValidation"
_ACTIONS = {a.value for a in EnforcementAction} | {SCOPED}
_SKIP_FILES = {"suite.yaml", "suite.yml"}


@dataclass(frozen=True)
class Document:
    file: str
    index: int
    body: dict[str, Any]

    @property
    def label(self) -> str:
        kind = self.body.get("kind", "?")
        name = (self.body.get("metadata") or {}).get("name", f"#{self.index}")
        return f"{kind}/{name}"


def read_documents(paths: str | Path | Iterable[str | Path]) -> tuple[list[Document], str]:
    """All YAML/JSON documents under `paths` (files or directories), and a content digest."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(
                f
                for f in sorted(p.rglob("*"))
                if f.suffix in (".yaml", ".yml", ".json")
                and f.name not in _SKIP_FILES
                and not any(part.startswith(".") for part in f.relative_to(p).parts)
            )
        elif p.exists():
            files.append(p)
        else:
            raise PolicyError(str(p), "-", "-", "no such file or directory")
    digest = hashlib.sha256()
    docs: list[Document] = []
    for f in files:
        raw = f.read_bytes()
        digest.update(str(f).encode() + b"\0" + raw)
        try:
            loaded = yaml_documents.load_all(raw)
        except yaml.YAMLError as e:
            raise PolicyError(str(f), "-", "-", f"not valid YAML: {e}") from None
        for i, body in enumerate(loaded):
            if isinstance(body, dict):
                if body.get("kind") == "List" and isinstance(body.get("items"), list):
                    docs.extend(Document(str(f), i, item) for item in body["items"] if isinstance(item, dict))
                else:
                    docs.append(Document(str(f), i, body))
    return docs, digest.hexdigest()[:16]


def _group(api_version: Any) -> str:
    s = str(api_version or "")
    return s.split("/", 1)[0] if "/" in s else ""


def _compile(doc: Document, fld: str, source: Any) -> tuple[Expression, frozenset[str]]:
    if not isinstance(source, str) or not source.strip():
        raise PolicyError(doc.file, doc.label, fld, "must be a non-empty CEL expression")
    try:
        program, used, roots = compile_expression(source)
    except CelCompileError as e:
        raise PolicyError(doc.file, doc.label, fld, f"invalid CEL: {e}") from None
    return Expression(source, program, fld, roots), used


def _named_expressions(doc: Document, raw: Any, fld: str) -> tuple[tuple[Variable, ...], frozenset[str]]:
    if raw is None:
        return (), frozenset()
    if not isinstance(raw, list):
        raise PolicyError(doc.file, doc.label, fld, "must be a list of {name, expression}")
    out: list[Variable] = []
    used: set[str] = set()
    seen: set[str] = set()
    for i, v in enumerate(raw):
        if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"]:
            raise PolicyError(doc.file, doc.label, f"{fld}[{i}].name", "required")
        if v["name"] in seen:
            raise PolicyError(doc.file, doc.label, f"{fld}[{i}].name", f"duplicate name {v['name']!r}")
        if v["name"] in ("anyObject", "params"):
            raise PolicyError(doc.file, doc.label, f"{fld}[{i}].name", f"{v['name']!r} is reserved")
        seen.add(v["name"])
        expr, fns = _compile(doc, f"{fld}[{i}].expression", v.get("expression"))
        out.append(Variable(v["name"], expr))
        used |= fns
    return tuple(out), frozenset(used)


def _validations(doc: Document, raw: Any, fld: str) -> tuple[tuple[Validation, ...], frozenset[str]]:
    if not isinstance(raw, list) or not raw:
        raise PolicyError(doc.file, doc.label, fld, "must be a non-empty list of validations")
    out: list[Validation] = []
    used: set[str] = set()
    for i, v in enumerate(raw):
        f = f"{fld}[{i}]"
        if not isinstance(v, dict):
            raise PolicyError(doc.file, doc.label, f, "must be an object with expression")
        expr, fns = _compile(doc, f"{f}.expression", v.get("expression"))
        used |= fns
        message = v.get("message")
        if message is not None and not isinstance(message, str):
            raise PolicyError(doc.file, doc.label, f"{f}.message", "must be a string")
        msg_expr = None
        if v.get("messageExpression") is not None:
            msg_expr, fns = _compile(doc, f"{f}.messageExpression", v["messageExpression"])
            used |= fns
        out.append(Validation(expr, message, msg_expr))
    return tuple(out), frozenset(used)


def _references(*groups: tuple[Variable, ...] | tuple[Validation, ...]) -> frozenset[str]:
    refs: set[str] = set()
    for group in groups:
        for item in group:
            if isinstance(item, Variable):
                refs |= item.expression.references
            else:
                refs |= item.expression.references
                if item.message_expression is not None:
                    refs |= item.message_expression.references
    return frozenset(refs)


def policy_key(kind: str, name: str) -> str:
    return "k" + hashlib.sha1(f"{kind}/{name}".encode()).hexdigest()[:12]


_UNDEFINED_VAR = re.compile(r"\bvariables\s*\.\s*([A-Za-z_]\w*)")


def _specialize(
    owner: tuple[str, str],
    key: str,
    conds: tuple[Variable, ...],
    variables: tuple[Variable, ...],
    validations: tuple[Validation, ...],
) -> tuple[tuple[Variable, ...], tuple[Validation, ...], frozenset[str], frozenset[str]]:
    """Recompile a template's expressions for one policy: its params key, variables inlined.

    Inlining `variables.x` as `(x's expression)` gives VAP's lazy variable semantics (an
    unused variable that would fail does not fail the policy) and lets a request bind its
    CEL context once, instead of once per policy and variable.
    """
    file, label = owner
    inline: dict[str, str] = {}
    for v in variables:
        inline[v.name] = rewrite(v.expression.source, key, inline)
    fns: set[str] = set()
    refs: set[str] = set()

    def comp(expr: Expression) -> Expression:
        try:
            program, used, roots = compile_expression(expr.source, key, inline)
        except CelCompileError as e:
            raise PolicyError(file, label, expr.field, f"invalid CEL: {e}") from None
        if "variables" in roots:
            names = sorted(set(_UNDEFINED_VAR.findall(rewrite(expr.source, key, inline)))) or ["?"]
            raise PolicyError(file, label, expr.field, f"undefined variable(s): {', '.join(names)}")
        fns.update(used)
        refs.update(roots)
        return Expression(expr.source, program, expr.field, roots)

    new_conds = tuple(Variable(c.name, comp(c.expression)) for c in conds)
    new_validations = tuple(
        Validation(
            comp(v.expression),
            v.message,
            comp(v.message_expression) if v.message_expression is not None else None,
        )
        for v in validations
    )
    return new_conds, new_validations, frozenset(fns), frozenset(refs)


def _fail_closed(doc: Document, raw: Any, fld: str) -> bool:
    if raw in (None, "Fail"):
        return True
    if raw == "Ignore":
        return False
    raise PolicyError(doc.file, doc.label, fld, f"must be Fail or Ignore (got {raw!r})")


def _enforcement(doc: Document, spec: dict[str, Any]) -> tuple[str, tuple[ScopedAction, ...]]:
    action = spec.get("enforcementAction", "deny") or "deny"
    if action not in _ACTIONS:
        raise PolicyError(
            doc.file,
            doc.label,
            "spec.enforcementAction",
            f"must be one of deny, warn, dryrun, scoped (got {action!r})",
        )
    raw = spec.get("scopedEnforcementActions")
    if action != SCOPED:
        if raw:
            raise PolicyError(
                doc.file,
                doc.label,
                "spec.scopedEnforcementActions",
                "only allowed with enforcementAction: scoped",
            )
        return action, ()
    if not isinstance(raw, list) or not raw:
        raise PolicyError(
            doc.file, doc.label, "spec.scopedEnforcementActions", "required with enforcementAction: scoped"
        )
    scoped: list[ScopedAction] = []
    for i, entry in enumerate(raw):
        f = f"spec.scopedEnforcementActions[{i}]"
        if not isinstance(entry, dict) or entry.get("action") not in {a.value for a in EnforcementAction}:
            raise PolicyError(doc.file, doc.label, f"{f}.action", "must be one of deny, warn, dryrun")
        points = []
        for j, p in enumerate(entry.get("enforcementPoints") or []):
            if not isinstance(p, dict) or not isinstance(p.get("name"), str):
                raise PolicyError(doc.file, doc.label, f"{f}.enforcementPoints[{j}].name", "required")
            points.append(p["name"])
        ns = entry.get("namespaces") or []
        ex = entry.get("excludedNamespaces") or []
        for key, val in (("namespaces", ns), ("excludedNamespaces", ex)):
            if not isinstance(val, list) or not all(isinstance(x, str) for x in val):
                raise PolicyError(doc.file, doc.label, f"{f}.{key}", "must be a list of strings")
        scoped.append(ScopedAction(EnforcementAction(entry["action"]), tuple(points), tuple(ns), tuple(ex)))
    return action, tuple(scoped)


def _load_template(doc: Document) -> Template:
    body = doc.body
    name = (body.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(doc.file, doc.label, "metadata.name", "required")
    spec = body.get("spec") or {}
    kind = ((((spec.get("crd") or {}).get("spec") or {}).get("names")) or {}).get("kind")
    if not isinstance(kind, str) or not kind:
        raise PolicyError(doc.file, doc.label, "spec.crd.spec.names.kind", "required")
    if kind.lower() != name:
        raise PolicyError(
            doc.file, doc.label, "metadata.name", f"must equal the lowercase kind {kind.lower()!r}"
        )
    schema = ((((spec.get("crd") or {}).get("spec") or {}).get("validation")) or {}).get("openAPIV3Schema")
    if schema is not None:
        try:
            jsonschema.Draft7Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise PolicyError(
                doc.file,
                doc.label,
                "spec.crd.spec.validation.openAPIV3Schema",
                f"invalid schema: {e.message}",
            ) from None
    targets = spec.get("targets")
    if not isinstance(targets, list) or not targets:
        raise PolicyError(doc.file, doc.label, "spec.targets", "required")
    for ti, target in enumerate(targets):
        if not isinstance(target, dict) or target.get("target") != "admission.k8s.gatekeeper.sh":
            continue
        for ci, code in enumerate(target.get("code") or []):
            if not isinstance(code, dict) or code.get("engine") != CEL_ENGINE:
                continue
            base = f"spec.targets[{ti}].code[{ci}].source"
            source = code.get("source") or {}
            conds, f1 = _named_expressions(doc, source.get("matchConditions"), f"{base}.matchConditions")
            variables, f2 = _named_expressions(doc, source.get("variables"), f"{base}.variables")
            validations, f3 = _validations(doc, source.get("validations"), f"{base}.validations")
            fail_closed = _fail_closed(doc, source.get("failurePolicy"), f"{base}.failurePolicy")
            return Template(name, kind, doc.file, schema, conds, variables, validations, fail_closed, f1 | f2 | f3,
                            _references(conds, variables, validations))  # fmt: skip
    raise PolicyError(
        doc.file,
        doc.label,
        "spec.targets[].code",
        f"no '{CEL_ENGINE}' engine for target admission.k8s.gatekeeper.sh (Rego is not supported)",
    )


def _check_params(doc: Document, schema: dict[str, Any] | None, params: Any, fld: str) -> None:
    if schema is None or params is None:
        return
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(params), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.path)
        raise PolicyError(doc.file, doc.label, f"{fld}{path}", e.message)


def _load_constraint(doc: Document, template: Template) -> Policy:
    body = doc.body
    name = (body.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(doc.file, doc.label, "metadata.name", "required")
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise PolicyError(doc.file, doc.label, "spec", "must be an object")
    params = spec.get("parameters")
    _check_params(doc, template.schema, params, "spec.parameters")
    action, scoped = _enforcement(doc, spec)
    key = policy_key(template.kind, name)
    conds, validations, fns, refs = _specialize(
        (template.file, f"ConstraintTemplate/{template.name}"), key,
        template.match_conditions, template.variables, template.validations,
    )  # fmt: skip
    return Policy(
        name=name,
        kind=template.kind,
        template=template.name,
        file=doc.file,
        match=parse_match(spec.get("match"), doc.file, doc.label, "spec.match"),
        enforcement_action=action,
        scoped_actions=scoped,
        parameters=params,
        params_binding=body,
        match_conditions=conds,
        variables=(),
        validations=validations,
        fail_closed=template.fail_closed,
        functions=fns,
        references=refs,
        key=key,
    )


def _load_admission_policy(doc: Document) -> Policy:
    body = doc.body
    name = (body.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(doc.file, doc.label, "metadata.name", "required")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise PolicyError(doc.file, doc.label, "spec", "required")
    unknown = set(spec) - {
        "enforcementAction", "scopedEnforcementActions", "failurePolicy", "matchConstraints", "match",
        "params", "paramsSchema", "matchConditions", "variables", "validations", "description",
    }  # fmt: skip
    if unknown:
        raise PolicyError(doc.file, doc.label, f"spec.{sorted(unknown)[0]}", "unknown field")
    params = spec.get("params")
    schema = spec.get("paramsSchema")
    if schema is not None:
        try:
            jsonschema.Draft7Validator.check_schema(schema)
        except jsonschema.SchemaError as e:
            raise PolicyError(
                doc.file, doc.label, "spec.paramsSchema", f"invalid schema: {e.message}"
            ) from None
    _check_params(doc, schema, params, "spec.params")
    action, scoped = _enforcement(doc, spec)
    conds, _ = _named_expressions(doc, spec.get("matchConditions"), "spec.matchConditions")
    variables, _ = _named_expressions(doc, spec.get("variables"), "spec.variables")
    validations, _ = _validations(doc, spec.get("validations"), "spec.validations")
    key = policy_key(QM_KIND, name)
    conds, validations, fns, refs = _specialize((doc.file, doc.label), key, conds, variables, validations)
    match_field = "spec.matchConstraints" if "matchConstraints" in spec else "spec.match"
    return Policy(
        name=name,
        kind=QM_KIND,
        template="",
        file=doc.file,
        match=parse_match(spec.get("matchConstraints", spec.get("match")), doc.file, doc.label, match_field),
        enforcement_action=action,
        scoped_actions=scoped,
        parameters=params,
        params_binding=params,
        match_conditions=conds,
        variables=(),
        validations=validations,
        fail_closed=_fail_closed(doc, spec.get("failurePolicy"), "spec.failurePolicy"),
        functions=fns,
        references=refs,
        key=key,
    )


@dataclass(frozen=True)
class PolicySet:
    """The active, compiled policies. Immutable; replace it as a whole to change policy."""

    policies: tuple[Policy, ...] = ()
    templates: tuple[Template, ...] = ()
    version: str = "empty"
    skipped: int = 0
    functions: frozenset[str] = field(default=frozenset())
    references: frozenset[str] = field(default=frozenset())  # root CEL variables any policy reads
    bindings: dict[str, Any] = field(default_factory=dict, compare=False)  # constant per set: params maps

    @classmethod
    def load(cls, paths: str | Path | Iterable[str | Path]) -> PolicySet:
        """Load and compile every policy under `paths`; raises PolicyError on the first invalid one."""
        docs, digest = read_documents(paths)
        return cls.from_documents(docs, version=digest)

    @classmethod
    def from_documents(
        cls, docs: Sequence[Document], version: str = "inline", templates: Iterable[Template] = ()
    ) -> PolicySet:
        by_kind: dict[str, Template] = {t.kind: t for t in templates}
        constraints: list[Document] = []
        policies: list[Policy] = []
        skipped = 0
        for doc in docs:
            group = _group(doc.body.get("apiVersion"))
            kind = doc.body.get("kind")
            if group == TEMPLATE_GROUP and kind == "ConstraintTemplate":
                t = _load_template(doc)
                if t.kind in by_kind and by_kind[t.kind].file != t.file:
                    raise PolicyError(doc.file, doc.label, "spec.crd.spec.names.kind",
                                      f"kind {t.kind} already defined in {by_kind[t.kind].file}")  # fmt: skip
                by_kind[t.kind] = t
            elif group == CONSTRAINT_GROUP:
                constraints.append(doc)
            elif doc.body.get("apiVersion") == QM_API and kind == QM_KIND:
                policies.append(_load_admission_policy(doc))
            elif group == "quartermaster.dev" and kind == QM_KIND:
                raise PolicyError(doc.file, doc.label, "apiVersion", f"unsupported version (use {QM_API})")
            else:
                skipped += 1
        for doc in constraints:
            kind = doc.body.get("kind")
            template = by_kind.get(kind)  # type: ignore[arg-type]
            if template is None:
                raise PolicyError(doc.file, doc.label, "kind", f"no ConstraintTemplate defines kind {kind!r}")
            policies.append(_load_constraint(doc, template))
        seen: dict[tuple[str, str], str] = {}
        for p in policies:
            key = (p.kind, p.name)
            if key in seen:
                raise PolicyError(
                    p.file, f"{p.kind}/{p.name}", "metadata.name", f"duplicate of one in {seen[key]}"
                )
            seen[key] = p.file
        return cls(tuple(policies), tuple(by_kind.values()), version, skipped, *_unions(policies))

    def replacing(self, other: PolicySet) -> PolicySet:
        """This set with `other`'s policies added, same (kind, name) replaced — for what-if."""
        keys = {(p.kind, p.name) for p in other.policies}
        kept = tuple(p for p in self.policies if (p.kind, p.name) not in keys)
        policies = kept + other.policies
        templates = {t.kind: t for t in self.templates} | {t.kind: t for t in other.templates}
        return PolicySet(
            policies, tuple(templates.values()), f"{self.version}+{other.version}", 0, *_unions(policies)
        )

    def __len__(self) -> int:
        return len(self.policies)


def _unions(policies: Iterable[Policy]) -> tuple[frozenset[str], frozenset[str], dict[str, Any]]:
    fns: set[str] = set()
    refs: set[str] = set()
    policies = list(policies)
    for p in policies:
        fns |= p.functions
        refs |= p.references
    bindings = {  # only the entries some expression reads: each is converted into CEL per request
        PARAMS_BY_POLICY: {p.key: p.parameters for p in policies if PARAMS_BY_POLICY in p.references},
        PARAMS_OBJECT_BY_POLICY: {
            p.key: p.params_binding for p in policies if PARAMS_OBJECT_BY_POLICY in p.references
        },
    }
    return frozenset(fns), frozenset(refs), bindings


def load_with_templates(paths: str | Path | Iterable[str | Path], base: PolicySet | None) -> PolicySet:
    """Load `paths`, resolving constraint kinds against `base`'s templates too (what-if of a constraint alone)."""
    docs, digest = read_documents(paths)
    return PolicySet.from_documents(docs, version=digest, templates=base.templates if base else ())
