"""A quicker constructor for frozen, slotted dataclasses.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__(self, name, value)``, which looks the name up in the class every time.
Records, envelopes and the quota core's decisions are built at every hop of every message
(8% of the queue-manager's busy samples in the smalls phase were those constructors), so
`quick_init` replaces that ``__init__`` with one of the same signature that calls each slot's
own setter. Instances are the same: the same class, fields, equality, hash and immutability
(``__setattr__`` still refuses); defaults, default factories, fields kept out of
``__init__`` and ``__post_init__`` are applied as the dataclass applies them. A class with an
``InitVar`` is refused, so the constructor never silently skips a step the dataclass would have
taken.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TypeVar

T = TypeVar("T", bound=type)
_LEFT_OUT = object()  # a factory field's argument was not passed


def quick_init(cls: T) -> T:
    """Decorator, above ``@dataclass(frozen=True, slots=True, ...)``: see the module docstring."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"quick_init: {cls.__name__} is not a frozen dataclass with slots")
    fields = dataclasses.fields(cls)
    passed = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    if passed != [f.name for f in fields if f.init]:  # an InitVar would be passed, not stored
        raise TypeError(f"quick_init: {cls.__name__}.__init__ takes {passed}, not its fields")
    namespace: dict[str, object] = {"_LEFT_OUT": _LEFT_OUT}
    positional: list[str] = []
    keyword: list[str] = []
    body = ""
    for f in fields:  # in the dataclass's order: defaults and factories as its __init__ applies them
        namespace[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        if f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            value = f"_factory_{f.name}()"
        elif f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            value = f"_default_{f.name}"
        else:
            value = None
        if not f.init:  # not a parameter: set to its default, if it has one
            body += f"    _set_{f.name}(self, {value})\n" if value else ""
            continue
        if f.default_factory is not dataclasses.MISSING:  # a sentinel default, as the dataclass uses
            (keyword if f.kw_only else positional).append(f"{f.name}=_LEFT_OUT")
            body += f"    _set_{f.name}(self, {value} if {f.name} is _LEFT_OUT else {f.name})\n"
            continue
        (keyword if f.kw_only else positional).append(f"{f.name}={value}" if value else f.name)
        body += f"    _set_{f.name}(self, {f.name})\n"
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    body += "    self.__post_init__()\n" if hasattr(cls, "__post_init__") else ""
    body = body or "    pass\n"
    exec(f"def __init__({signature}):\n{body}", namespace)  # noqa: S102 - built from field names only
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init
    return cls
