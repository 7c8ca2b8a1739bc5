"""The pure matching helpers of the routing mirror (:mod:`rabbitflow_broker.engine.routing`).

AMQP field values as Erlang compares them, headers-binding patterns, the
topic trie walk and the ``CC``/``BCC`` routing keys of a message; the
semantics they follow are described in :mod:`rabbitflow_broker.engine.routing`.
No I/O, no clock, no logging.  Also home of the routing error tree, which
:mod:`rabbitflow_broker.engine.routing` re-exports.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rabbitflow_broker.engine.errors import UsageError

__all__ = ["RoutingError", "RoutingNotFoundError", "RoutingValueError", "Term"]


class RoutingError(UsageError):
    """Base of every error raised by :mod:`rabbitflow_broker.engine.routing`."""


class RoutingNotFoundError(RoutingError, LookupError):
    """A binding names an exchange or queue the table does not know."""


class RoutingValueError(RoutingError, ValueError):
    """An operation or value RabbitMQ itself would refuse."""


# --- AMQP values as Erlang sees them -------------------------------------------------


class _Atom(enum.Enum):
    """Erlang atoms that appear as field values; never equal to a number."""

    TRUE = "true"
    FALSE = "false"
    VOID = "undefined"


Term = object  # a hashable canonical value: int, float, bytes, _Atom or tagged tuple


def _term(value: object) -> Term:
    """Canonical top-level value: the AMQP type is dropped, as Erlang's ``==`` does."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if value is None:
        return _Atom.VOID
    if isinstance(value, bool):
        return _Atom.TRUE if value else _Atom.FALSE
    if isinstance(value, int | float):
        return value
    if isinstance(value, decimal.Decimal):
        return ("decimal", *_decimal_parts(value))
    if isinstance(value, _dt.datetime):
        # AMQP timestamps are whole seconds since the epoch (UTC), as pika sends them.
        stamp = value if value.tzinfo else value.replace(tzinfo=_dt.UTC)
        return int(stamp.timestamp())
    if isinstance(value, Mapping):
        return ("table", tuple((_key(k), *_typed(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("array", tuple(_typed(v) for v in value))
    raise RoutingValueError(f"unsupported AMQP field value {value!r} ({type(value).__name__})")


def _typed(value: object) -> tuple[str, Term]:
    """(type, value) as an element of an array or nested table, where types count."""
    if isinstance(value, str):
        return ("longstr", value.encode())
    if isinstance(value, bytes | bytearray | memoryview):
        return ("binary", bytes(value))
    if value is None:
        return ("void", _Atom.VOID)
    if isinstance(value, bool):
        return ("bool", _Atom.TRUE if value else _Atom.FALSE)
    if isinstance(value, int):
        return ("signedint" if -(2**31) <= value < 2**31 else "long", value)
    if isinstance(value, float):
        return ("double", value)
    if isinstance(value, decimal.Decimal):
        return ("decimal", _decimal_parts(value))
    if isinstance(value, _dt.datetime):
        return ("timestamp", _term(value))
    if isinstance(value, Mapping):
        return ("table", _term(value))
    if isinstance(value, list | tuple):
        return ("array", _term(value))
    raise RoutingValueError(f"unsupported AMQP field value {value!r} ({type(value).__name__})")


def _decimal_parts(value: decimal.Decimal) -> tuple[int, int]:
    # pika normalises before encoding, so equal decimals encode alike.
    value = value.normalize()
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent < 0:
        return (-exponent, int(value.scaleb(-exponent)))
    return (0, int(value))


def _key(key: object) -> bytes:
    if isinstance(key, str):
        return key.encode()
    if isinstance(key, bytes):
        return key
    raise RoutingValueError(f"field table key must be a string, got {key!r}")


def _args_id(arguments: Mapping[str, object] | None) -> tuple[tuple[bytes, Term], ...]:
    """Identity of a binding's arguments: RabbitMQ sorts the top-level table."""
    if not arguments:
        return ()
    return tuple(sorted((_key(k), _term(v)) for k, v in arguments.items()))


# --- bindings --------------------------------------------------------------------------

# A destination: (False, queue name) or (True, exchange name).
_Dest = tuple[bool, str]
_BindingId = tuple[_Dest, str, tuple[tuple[bytes, Term], ...]]


class _MatchMode(enum.Enum):
    ALL = "all"
    ANY = "any"
    ALL_WITH_X = "all-with-x"
    ANY_WITH_X = "any-with-x"


@dataclass(frozen=True, slots=True)
class _HeadersPattern:
    """A headers binding compiled once: the keys to test and how to combine them."""

    match_all: bool
    keys: tuple[tuple[bytes, Term], ...]  # value _Atom.VOID = presence test

    @classmethod
    def compile(cls, arguments: Mapping[str, object] | None) -> _HeadersPattern:
        args = dict(arguments or {})
        raw_mode = args.get("x-match", "all")
        if not isinstance(raw_mode, str):
            raise RoutingValueError(f"x-match must be a string, got {raw_mode!r}")
        try:
            mode = _MatchMode(raw_mode)
        except ValueError:
            raise RoutingValueError(
                f"invalid x-match {raw_mode!r}; expected all, any, all-with-x or any-with-x"
            ) from None
        with_x = mode in (_MatchMode.ALL_WITH_X, _MatchMode.ANY_WITH_X)
        keys = tuple(
            (_key(k), _term(v))
            for k, v in args.items()
            if k != "x-match" and (with_x or not k.startswith("x-"))
        )
        return cls(mode in (_MatchMode.ALL, _MatchMode.ALL_WITH_X), keys)

    def matches(self, data: Mapping[bytes, Term]) -> bool:
        if self.match_all:
            for key, value in self.keys:
                got = data.get(key, _MISSING)
                if got is _MISSING or (value is not _Atom.VOID and got != value):
                    return False
            return True
        for key, value in self.keys:
            got = data.get(key, _MISSING)
            if got is not _MISSING and (value is _Atom.VOID or got == value):
                return True
        return False


_MISSING = object()
_OPAQUE = object()  # equal to nothing but itself


class _TopicNode:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _TopicNode] = {}
        self.dests: dict[_Dest, int] = {}


def _topic_match(root: _TopicNode, words: Sequence[str], out: dict[_Dest, int]) -> None:
    """Collect the destinations of every binding pattern matching ``words``.

    Same walk as RabbitMQ's trie: at each node try the literal word, ``*`` and
    ``#`` (which may swallow any number of words).  ``(node, position)`` pairs
    already visited are skipped so ``#.#.#`` patterns stay linear.
    """
    n = len(words)
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[_TopicNode, int]] = [(root, 0)]
    while stack:
        node, i = stack.pop()
        mark = (id(node), i)
        if mark in seen:
            continue
        seen.add(mark)
        children = node.children
        if i == n:
            out.update(node.dests)
        else:
            child = children.get(words[i])
            if child is not None:
                stack.append((child, i + 1))
            child = children.get("*")
            if child is not None:
                stack.append((child, i + 1))
        hash_child = children.get("#")
        if hash_child is not None:
            stack.extend((hash_child, j) for j in range(i, n + 1))


def _split_topic_key(key: str) -> list[str]:
    """Words of a topic routing or binding key, as RabbitMQ splits them ("" has none)."""
    return key.split(".") if key else []


def _header_routes(headers: Mapping[str, object]) -> list[str] | None:
    """Extra routing keys from CC then BCC; ``None`` when RabbitMQ rejects the message."""
    routes: list[str] = []
    for name in ("CC", "BCC"):
        value = headers.get(name)
        if value is None and name not in headers:
            continue
        if not isinstance(value, list | tuple):
            return None
        routes.extend(v for v in value if isinstance(v, str))
    return routes


def _headers_data(headers: Mapping[str, object] | None) -> dict[bytes, Term]:
    if not headers:
        return {}
    data: dict[bytes, Term] = {}
    for key, value in headers.items():
        if key == "BCC":
            continue
        try:
            data[_key(key)] = _term(value)
        except RoutingValueError:
            # A value we cannot represent equals no binding value; presence still counts.
            data[_key(key)] = _OPAQUE
    return data
