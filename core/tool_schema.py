"""Tool argument schemas that validate without reaching outside the process or freezing it.

A tool's JSON Schema may come from an MCP server, i.e. from a stranger. Validation runs on the event loop,
before any approval and at any trust level, so it must never resolve a reference (jsonschema's default
fetches a remote ``$ref`` with ``urlopen``: a request from the bot's own process, past the egress policy)
and never run for long: ``"pattern": "^(a|aa)+$"`` against a model-chosen string takes minutes, local
references can fan out (17 definitions each checking the next twice: 2**17 checks) or loop for ever
(``{"allOf": [{"$ref": "#"}]}``), and jsonschema's ``uniqueItems`` compares every pair of items that do
not sort. Hence: an empty reference registry, a non-local reference refused when the tool is read, every
keyword checked against one time budget per call (patterns matched by ``regex`` under what is left of
it, ``additionalProperties``' look at the patterns too), ``uniqueItems`` in linear time, and a recursion
that runs too deep refused like a timeout. ``unevaluatedProperties`` / ``unevaluatedItems`` are refused
when the tool is read: jsonschema works out what was evaluated by walking the schema itself, outside any
keyword (so outside the budget), with unbounded patterns and in quadratic time. Numbers that are not
finite (``NaN``, which ``json.loads`` accepts) or arithmetic that overflows are refused, not crashes.
"""

from __future__ import annotations

import contextvars
import functools
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jsonschema
import regex
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

from core.errors import SchemaCheckError

# One call's whole check (every keyword, every pattern) shares this much time; past it the arguments are refused.
CHECK_BUDGET_S = 0.25
_TOO_LONG = "checking the arguments took too long (the tool's schema is too costly)"
REFERENCE_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose check walks the schema outside the bounded keywords (see above): a schema using one is refused.
UNBOUNDED_KEYWORDS = ("unevaluatedProperties", "unevaluatedItems")
_NAME_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # keys are names
# A registry that knows no document and retrieves none: only references inside the schema itself resolve.
_NOTHING = Registry()
_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("tool_schema_deadline", default=0.0)


def _remaining() -> float:
    remaining = _deadline.get() - time.monotonic()
    if remaining <= 0:
        raise SchemaCheckError(_TOO_LONG)
    return remaining


def _search(pattern: str, text: str) -> bool:
    try:
        return regex.search(_ecma_end(pattern), text, timeout=_remaining()) is not None
    except TimeoutError as exc:
        raise SchemaCheckError(_TOO_LONG) from exc
    except regex.error as exc:
        raise SchemaCheckError(f"the schema's pattern {pattern[:80]!r} is not a valid regular expression") from exc


@functools.lru_cache(maxsize=1024)
def _ecma_end(pattern: str) -> str:
    """``pattern`` with each ``$`` (outside a character class, unescaped) as JSON Schema's dialect (ECMA-262) reads
    it: the end of the text. Python's ``$`` also matches before a final line break, so ``"U1\\n"`` would pass
    ``^U[0-9]+$``."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        elif in_class:
            in_class = ch != "]"
            out.append(ch)
            i += 1
        elif ch == "[":  # the class's opening: [, an optional ^, and a ] right after them (a literal one)
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"
            out.append(pattern[i:j])
            i, in_class = j, True
        else:
            out.append(r"(?!\n)$" if ch == "$" else ch)  # zero-width: the end, never before a final line break
            i += 1
    return "".join(out)


def _pattern(validator: Validator, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance[:200]!r} does not match {pattern[:200]!r}")


def _pattern_properties(validator: Validator, patterns: dict[str, Any], instance: Any,
                        schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Validator, additional: Any, instance: Any,
                           schema: Any) -> Iterator[ValidationError]:
    # jsonschema's own matches patternProperties with plain ``re``, before (or without) the bounded keyword.
    if not validator.is_type(instance, "object"):
        return
    known, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
    extras = [name for name in instance
              if name not in known and not any(_search(pattern, name) for pattern in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        shown = ", ".join(repr(name[:80]) for name in sorted(extras)[:10])
        verb = "was" if len(extras) == 1 else "were"
        yield ValidationError(f"Additional properties are not allowed ({shown} {verb} unexpected)")


def _unique_key(value: Any) -> Any:
    """A hashable stand-in equal for exactly the values JSON Schema calls equal: 1 == 1.0, True != 1,
    objects whatever their key order."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", value)  # Python already has 1 == 1.0 and hash(1) == hash(1.0)
    if isinstance(value, list):
        return ("array", tuple(_unique_key(v) for v in value))
    if isinstance(value, dict):
        return ("object", frozenset((k, _unique_key(v)) for k, v in value.items()))
    return ("other", repr(value))


def _unique_items(validator: Validator, unique: bool, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not unique or not validator.is_type(instance, "array"):
        return
    seen: set[Any] = set()
    for item in instance:
        key = _unique_key(item)
        if key in seen:
            yield ValidationError(f"{str(instance)[:200]} has non-unique elements")
            return
        seen.add(key)


Keyword = Callable[[Validator, Any, Any, Any], Iterable[ValidationError] | None]


def _on_budget(keyword: Keyword) -> Keyword:
    """``keyword`` checked against the call's deadline first: a schema whose references fan out reaches
    its keywords an exponential number of times, and each reach costs at least this check."""

    def bounded(validator: Validator, value: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
        _remaining()
        yield from keyword(validator, value, instance, schema) or ()

    return bounded


_KEYWORDS: dict[str, Keyword] = {**Draft202012Validator.VALIDATORS, "pattern": _pattern,
                                 "patternProperties": _pattern_properties, "uniqueItems": _unique_items,
                                 "additionalProperties": _additional_properties}
_BoundedValidator = jsonschema.validators.extend(
    Draft202012Validator, {name: _on_budget(check) for name, check in _KEYWORDS.items()})


def schema_problem(schema: Any) -> str | None:
    """Why arguments cannot be checked against ``schema`` safely, or None: a reference that points outside it
    (anything but ``#…``: checking would mean fetching it), or a keyword checked outside the time budget. Keys of
    ``properties`` and the like are names, not keywords (a property may be called ``unevaluatedItems``)."""
    stack: list[tuple[Any, bool]] = [(schema, False)]
    while stack:
        node, names = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if not names and key in REFERENCE_KEYS and isinstance(value, str) and not value.startswith("#"):
                    return f"it refers outside itself ({key} {value[:120]!r})"
                if not names and key in UNBOUNDED_KEYWORDS:
                    return f"it uses {key}, which the bot does not check (its cost has no bound)"
                if isinstance(value, dict | list):
                    stack.append((value, not names and key in _NAME_MAPS))
        elif isinstance(node, list):
            stack.extend((item, False) for item in node)
    return None


class ArgumentSchema:
    """One tool's parameters schema, compiled once; ``first_error`` checks a call's arguments against it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        _check_schema(schema)
        self._validator = _BoundedValidator(schema, registry=_NOTHING)

    def first_error(self, args: dict[str, Any]) -> ValidationError | None:
        """The most relevant violation, or None; SchemaCheckError when the check itself cannot be done."""
        token = _deadline.set(time.monotonic() + CHECK_BUDGET_S)
        try:
            return jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        except Unresolvable as exc:
            raise SchemaCheckError(f"the schema refers to {str(exc)[:120]}, which is not resolved") from exc
        except RecursionError as exc:  # a reference that leads back to itself without descending
            raise SchemaCheckError("the tool's schema refers to itself without end") from exc
        except (ArithmeticError, ValueError) as exc:  # multipleOf against a huge or non-finite number
            raise SchemaCheckError(f"a number in them cannot be checked ({type(exc).__name__})") from exc
        finally:
            _deadline.reset(token)


_VALID_SCHEMAS: set[str] = set()  # schemas already found valid, as canonical JSON (the same tools each build)


def _check_schema(schema: dict[str, Any]) -> None:
    """Draft 2020-12's check of a schema (SchemaError when invalid), done once per distinct schema: the built-in
    tools are registered again by every application built, and the check is most of a registration's cost."""
    try:
        key = json.dumps(schema, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # not plain JSON: checked every time (and refused there)
        Draft202012Validator.check_schema(schema)
        return
    if key not in _VALID_SCHEMAS:
        Draft202012Validator.check_schema(schema)
        if len(_VALID_SCHEMAS) < 4096:  # MCP servers list tools too: bounded, whatever they list
            _VALID_SCHEMAS.add(key)
