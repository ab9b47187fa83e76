"""Tool argument schemas that validate without reaching outside the process or freezing it.

A tool's JSON Schema may come from an MCP server, i.e. from a stranger. Validation runs on the event loop,
before any approval and at any trust level, so it must never resolve a reference (jsonschema's default
fetches a remote ``$ref`` with ``urlopen``: a request from the bot's own process, past the egress policy)
and never run a regular expression without a bound (``"pattern": "^(a+)+$"`` against a model-chosen
string takes minutes). Hence: an empty reference registry, a non-local reference refused when the tool
is read, and ``pattern`` / ``patternProperties`` matched by ``regex`` under one time budget per call.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import regex
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.exceptions import Unresolvable

# Every pattern match of one call's validation shares this much time; past it the arguments are refused.
PATTERN_BUDGET_S = 0.25
REFERENCE_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# A registry that knows no document and retrieves none: only references inside the schema itself resolve.
_NOTHING = Registry()
_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("tool_schema_deadline", default=0.0)


class SchemaCheckError(Exception):
    """The arguments could not be checked against the schema (an unresolvable reference, a costly pattern)."""


def _search(pattern: str, text: str) -> bool:
    remaining = _deadline.get() - time.monotonic()
    if remaining <= 0:
        raise SchemaCheckError("checking the arguments' patterns took too long")
    try:
        return regex.search(pattern, text, timeout=remaining) is not None
    except TimeoutError as exc:
        raise SchemaCheckError("checking the arguments' patterns took too long") from exc
    except regex.error as exc:
        raise SchemaCheckError(f"the schema's pattern {pattern[:80]!r} is not a valid regular expression") from exc


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


_BoundedValidator = jsonschema.validators.extend(
    Draft202012Validator, {"pattern": _pattern, "patternProperties": _pattern_properties})


def nonlocal_reference(schema: Any) -> str | None:
    """The first reference in ``schema`` that points outside it (anything but ``#…``), or None."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REFERENCE_KEYS and isinstance(value, str) and not value.startswith("#"):
                    return f"{key} {value[:120]!r}"
                if isinstance(value, dict | list):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return None


class ArgumentSchema:
    """One tool's parameters schema, compiled once; ``errors`` checks a call's arguments against it."""

    def __init__(self, schema: dict[str, Any]) -> None:
        Draft202012Validator.check_schema(schema)
        self._validator = _BoundedValidator(schema, registry=_NOTHING)

    def first_error(self, args: dict[str, Any]) -> ValidationError | None:
        """The most relevant violation, or None; SchemaCheckError when the check itself cannot be done."""
        token = _deadline.set(time.monotonic() + PATTERN_BUDGET_S)
        try:
            return jsonschema.exceptions.best_match(self._validator.iter_errors(args))
        except Unresolvable as exc:
            raise SchemaCheckError(f"the schema refers to {str(exc)[:120]}, which is not resolved") from exc
        finally:
            _deadline.reset(token)
