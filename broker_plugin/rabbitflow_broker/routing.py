"""Where each publish goes: a pure mirror of RabbitMQ 3.10's routing.

:class:`RoutingTable` holds, per virtual host, the exchanges, queues,
bindings and policies the gateway has seen (from a management-API snapshot
and from the declare/bind/unbind/delete traffic it relays) and answers
``route(vhost, exchange, routing_key, headers)`` with the names of the
queues RabbitMQ enqueues that publish on.  No I/O, no clock, no logging.

Semantics, read from the RabbitMQ 3.10.8 sources (``rabbit_exchange:route/2``,
``rabbit_basic:make_message/4``, ``rabbit_exchange_type_{direct,topic,
headers}``, ``rabbit_policy``) and checked by the differential test in
``integration/routing``:

* **Routing keys** of a message are its routing key followed by the
  ``longstr`` elements of the ``CC`` and then ``BCC`` header arrays.  Other
  element types (a Python ``bytes`` element, which pika sends as a
  byte array) are silently ignored.  A ``CC``/``BCC`` header that is not an
  array makes RabbitMQ close the channel (406), so :meth:`RoutingTable.route`
  returns no queue.  Every exchange a message traverses (exchange-to-exchange
  bindings, alternate exchanges, the default exchange) routes on *all* of
  these keys.
* ``BCC`` is stripped from the headers *before* routing, so a headers
  exchange never sees it; ``CC`` stays and can be matched.
* **Default exchange** (``""``): every routing key (incl. CC/BCC) names a
  queue; names of queues that do not exist are dropped.  It never consults
  an alternate exchange.  Direct reply-to pseudo-queues
  (``amq.rabbitmq.reply-to.*``) are not queues and are not reported.
* **Traversal**: a work list starts at the published-to exchange; each
  exchange is routed at most once per message (cycle-safe); every queue is
  reported once.  An exchange's **alternate exchange** is consulted when
  *that exchange's own bindings* match nothing -- not when the whole route
  ends up reaching no queue.  Surprising consequences, both verified
  against 3.10.8:

  - the AE of an exchange reached through an exchange-to-exchange binding
    (or as an AE itself) *is* consulted when that exchange matches nothing;
  - an exchange whose only match is an exchange-to-exchange binding to an
    exchange that routes nowhere does *not* use its own AE (the message is
    unroutable), and a matching binding of an exchange to itself likewise
    suppresses its AE.

  The ``alternate-exchange`` argument wins over a policy's
  ``alternate-exchange``.  An AE naming a missing exchange is ignored.
* **Policies**: exactly one policy applies to an exchange -- the
  highest-priority one of its vhost whose ``apply-to`` is ``exchanges`` or
  ``all`` and whose ``pattern`` (a regular expression, searched anywhere in
  the name) matches.  Equal priorities keep the order given.  If that
  policy has no ``alternate-exchange``, a lower-priority one that has it
  does *not* apply.
* **Topic**: keys split on ``"."``; ``""`` is zero words while ``"."`` is
  two empty words; ``*`` matches exactly one (possibly empty) word, ``#``
  zero or more.
* **Headers**: ``x-match`` is ``all`` (default, also for a missing
  ``x-match``), ``any``, ``all-with-x`` or ``any-with-x``.  Binding keys
  starting with ``x-`` are ignored except in the ``-with-x`` modes
  (``x-match`` itself is always ignored).  ``all`` with no remaining keys
  matches every message; ``any`` with none matches nothing.  A key with a
  void value (Python ``None``) tests presence.  Values compare with
  Erlang's ``==``: the AMQP *type* is ignored at the top level (a ``longstr``
  equals a byte array with the same bytes, an integer equals a timestamp or
  a float of equal value; a boolean equals only a boolean), but inside
  arrays and nested tables element types matter and nested tables compare
  in order.
* **Internal** exchanges cannot be published to (RabbitMQ answers 403);
  :meth:`RoutingTable.route` returns no queue for them, as for an unknown
  exchange (404), but they are routed through normally.
* Exchange types other than direct, fanout, topic and headers (plugins)
  are kept but route nowhere.

Limits of the mirror:

* Python values carry less type information than AMQP.  Inside arrays and
  nested tables an ``int`` is taken as pika encodes it (``signedint`` when
  it fits 32 bits, else ``long``), ``str`` as ``longstr`` and ``bytes`` as a
  byte array.
* The management API shows a void binding argument as the string
  ``"undefined"`` and garbles decimals (``Decimal("1.5")`` as ``1.15``);
  :meth:`RoutingTable.from_management` reads ``"undefined"`` as void.
* Policy patterns are PCRE in RabbitMQ and Python ``re`` here; the common
  subset is identical.
* Auto-delete, exclusive-queue lifetimes, firehose tracing and exchange
  decorators are not modelled; the gateway re-snapshots.

Errors (one tree)::

    RoutingError
    ├── RoutingNotFoundError (LookupError)  bind to an unknown exchange/queue:
    │                                       the mirror is stale, re-snapshot
    └── RoutingValueError (ValueError)      something RabbitMQ refuses: binding
                                            or deleting the default exchange,
                                            a bad x-match, a bad policy
"""

from __future__ import annotations

import datetime as _dt
import decimal
import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "PREDECLARED_EXCHANGES",
    "RoutingError",
    "RoutingNotFoundError",
    "RoutingTable",
    "RoutingValueError",
]

_EMPTY: frozenset[str] = frozenset()

#: Exchanges RabbitMQ 3.10 creates in every virtual host: name -> (type, internal).
PREDECLARED_EXCHANGES: Mapping[str, tuple[str, bool]] = {
    "amq.direct": ("direct", False),
    "amq.fanout": ("fanout", False),
    "amq.topic": ("topic", False),
    "amq.headers": ("headers", False),
    "amq.match": ("headers", False),
    "amq.rabbitmq.trace": ("topic", True),
}

_ROUTE_CACHE_LIMIT = 4096


class RoutingError(Exception):
    """Base of every error raised by :mod:`rabbitflow_broker.routing`."""


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


class _Exchange:
    """One exchange, its outgoing bindings, and indexes for fast matching."""

    __slots__ = (
        "_cache",
        "alternate_arg",
        "alternate_policy",
        "arguments",
        "bindings",
        "direct",
        "fanout",
        "headers",
        "internal",
        "name",
        "topic",
        "type",
    )

    def __init__(
        self, name: str, type_: str, arguments: Mapping[str, object] | None, internal: bool
    ) -> None:
        self.name = name
        self.type = type_
        self.internal = internal
        self.arguments: dict[str, object] = dict(arguments or {})
        alternate = self.arguments.get("alternate-exchange")
        self.alternate_arg: str | None = alternate if isinstance(alternate, str) else None
        self.alternate_policy: str | None = None
        # Each binding with the arguments it was made with (to rebuild on redeclare).
        self.bindings: dict[_BindingId, Mapping[str, object] | None] = {}
        self.direct: dict[str, dict[_Dest, int]] = {}
        self.fanout: dict[_Dest, int] = {}
        self.topic = _TopicNode()
        self.headers: dict[_BindingId, _HeadersPattern] = {}
        self._cache: dict[str, tuple[_Dest, ...]] = {}

    @property
    def alternate(self) -> str | None:
        return self.alternate_arg if self.alternate_arg is not None else self.alternate_policy

    def add(self, bid: _BindingId, arguments: Mapping[str, object] | None) -> bool:
        if bid in self.bindings:
            return False
        pattern = _HeadersPattern.compile(arguments) if self.type == "headers" else None
        dest, key, _ = bid
        self.bindings[bid] = arguments
        self._cache.clear()
        if self.type == "direct":
            _incr(self.direct.setdefault(key, {}), dest)
        elif self.type == "fanout":
            _incr(self.fanout, dest)
        elif self.type == "topic":
            node = self.topic
            for word in _split_topic_key(key):
                node = node.children.setdefault(word, _TopicNode())
            _incr(node.dests, dest)
        elif pattern is not None:
            self.headers[bid] = pattern
        return True

    def remove(self, bid: _BindingId) -> bool:
        if bid not in self.bindings:
            return False
        del self.bindings[bid]
        self._cache.clear()
        dest, key, _ = bid
        if self.type == "direct":
            dests = self.direct[key]
            _decr(dests, dest)
            if not dests:
                del self.direct[key]
        elif self.type == "fanout":
            _decr(self.fanout, dest)
        elif self.type == "topic":
            self._topic_remove(_split_topic_key(key), dest)
        elif self.type == "headers":
            del self.headers[bid]
        return True

    def _topic_remove(self, words: list[str], dest: _Dest) -> None:
        path = [self.topic]
        for word in words:
            path.append(path[-1].children[word])
        _decr(path[-1].dests, dest)
        # Prune empty branches so the trie does not grow with churn.
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.dests or node.children:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, keys: Sequence[str], headers: Mapping[bytes, Term]) -> Iterable[_Dest]:
        """Destinations of the bindings matching a message (may repeat)."""
        kind = self.type
        if kind == "direct":
            if len(keys) == 1:
                return self.direct.get(keys[0], ())
            found: dict[_Dest, int] = {}
            for key in keys:
                found.update(self.direct.get(key, {}))
            return found
        if kind == "fanout":
            return self.fanout
        if kind == "topic":
            if len(keys) == 1:
                return self._topic_cached(keys[0])
            return {dest: 1 for key in keys for dest in self._topic_cached(key)}
        if kind == "headers":
            return [dest for (dest, _, _), p in self.headers.items() if p.matches(headers)]
        return ()

    def _topic_cached(self, key: str) -> tuple[_Dest, ...]:
        hit = self._cache.get(key)
        if hit is None:
            found: dict[_Dest, int] = {}
            _topic_match(self.topic, _split_topic_key(key), found)
            hit = tuple(found)
            if len(self._cache) >= _ROUTE_CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit


def _incr(counts: dict[_Dest, int], dest: _Dest) -> None:
    counts[dest] = counts.get(dest, 0) + 1


def _decr(counts: dict[_Dest, int], dest: _Dest) -> None:
    left = counts[dest] - 1
    if left:
        counts[dest] = left
    else:
        del counts[dest]


@dataclass(frozen=True, slots=True)
class _Policy:
    name: str
    pattern: re.Pattern[str]
    applies_to_exchanges: bool
    priority: int
    alternate: str | None

    @classmethod
    def parse(cls, item: Mapping[str, object]) -> _Policy:
        name = str(item.get("name", ""))
        pattern = item.get("pattern")
        definition = item.get("definition", {})
        priority = item.get("priority", 0)
        apply_to = item.get("apply-to", "all")
        if not isinstance(pattern, str):
            raise RoutingValueError(f"policy {name!r}: pattern must be a string")
        if not isinstance(definition, Mapping):
            raise RoutingValueError(f"policy {name!r}: definition must be an object")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise RoutingValueError(f"policy {name!r}: priority must be an integer")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise RoutingValueError(f"policy {name!r}: bad pattern {pattern!r}: {exc}") from exc
        alternate = definition.get("alternate-exchange")
        return cls(
            name,
            compiled,
            apply_to in ("exchanges", "all"),
            priority,
            alternate if isinstance(alternate, str) else None,
        )


class _VHost:
    __slots__ = ("bound_to", "exchanges", "policies", "queues")

    def __init__(self) -> None:
        self.exchanges: dict[str, _Exchange] = {
            name: _Exchange(name, type_, None, internal)
            for name, (type_, internal) in PREDECLARED_EXCHANGES.items()
        }
        self.queues: dict[str, dict[str, object]] = {}
        self.policies: tuple[_Policy, ...] = ()
        # Reverse index: destination -> bindings pointing at it, for deletes.
        self.bound_to: dict[_Dest, set[tuple[str, _BindingId]]] = {}

    def policy_alternate(self, exchange: str) -> str | None:
        for policy in self.policies:
            if policy.applies_to_exchanges and policy.pattern.search(exchange):
                return policy.alternate
        return None


class RoutingTable:
    """Exchanges, queues, bindings and policies of every vhost; answers :meth:`route`.

    Mutators mirror what RabbitMQ accepted (call them after the broker's
    ``*-ok``); they raise only for what RabbitMQ would refuse or for a stale
    mirror (see the module docstring for the error tree).
    """

    def __init__(self) -> None:
        self._vhosts: dict[str, _VHost] = {}

    def __repr__(self) -> str:
        counts = ", ".join(
            f"{name!r}: {len(v.exchanges)} exchanges/{len(v.queues)} queues"
            for name, v in sorted(self._vhosts.items())
        )
        return f"RoutingTable({{{counts}}})"

    # --- declarations ---------------------------------------------------------------

    def _vhost(self, vhost: str) -> _VHost:
        v = self._vhosts.get(vhost)
        if v is None:
            v = self._vhosts[vhost] = _VHost()
        return v

    def declare_exchange(
        self,
        vhost: str,
        name: str,
        type_: str,
        arguments: Mapping[str, object] | None = None,
        *,
        internal: bool = False,
    ) -> None:
        """Add an exchange; redeclaring keeps its bindings and takes the new attributes.

        Raises:
            RoutingValueError: ``name`` is the default exchange, or the type
                differs from that of the existing exchange of that name.
        """
        if name == "":
            raise RoutingValueError("the default exchange cannot be declared")
        v = self._vhost(vhost)
        old = v.exchanges.get(name)
        if old is not None and old.type != type_:
            raise RoutingValueError(
                f"exchange {name!r} in vhost {vhost!r} is {old.type}, not {type_}"
            )
        x = _Exchange(name, type_, arguments, internal)
        x.alternate_policy = v.policy_alternate(name)
        if old is not None:
            for bid, args in old.bindings.items():
                x.add(bid, args)
        v.exchanges[name] = x

    def delete_exchange(self, vhost: str, name: str) -> None:
        """Remove an exchange and every binding where it is source or destination.

        Deleting an unknown exchange is a no-op (as ``exchange.delete`` is).

        Raises:
            RoutingValueError: ``name`` is the default exchange.
        """
        if name == "":
            raise RoutingValueError("the default exchange cannot be deleted")
        v = self._vhosts.get(vhost)
        if v is None:
            return
        x = v.exchanges.pop(name, None)
        if x is None:
            return
        for bid in x.bindings:
            self._unindex(v, name, bid)
        self._drop_bindings_to(v, (True, name))

    def declare_queue(
        self, vhost: str, name: str, arguments: Mapping[str, object] | None = None
    ) -> None:
        """Add a queue (redeclaring keeps its bindings)."""
        self._vhost(vhost).queues[name] = dict(arguments or {})

    def delete_queue(self, vhost: str, name: str) -> None:
        """Remove a queue and its bindings; unknown queues are a no-op."""
        v = self._vhosts.get(vhost)
        if v is None or v.queues.pop(name, None) is None:
            return
        self._drop_bindings_to(v, (False, name))

    def _drop_bindings_to(self, v: _VHost, dest: _Dest) -> None:
        for source, bid in v.bound_to.pop(dest, ()):
            source_x = v.exchanges.get(source)
            if source_x is not None:
                source_x.remove(bid)

    def _unindex(self, v: _VHost, source: str, bid: _BindingId) -> None:
        refs = v.bound_to.get(bid[0])
        if refs is not None:
            refs.discard((source, bid))
            if not refs:
                del v.bound_to[bid[0]]

    # --- bindings -------------------------------------------------------------------

    def _bind(
        self,
        vhost: str,
        dest: _Dest,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object] | None,
    ) -> None:
        if source == "" or (dest[0] and dest[1] == ""):
            raise RoutingValueError("operation not permitted on the default exchange")
        v = self._vhosts.get(vhost)
        if v is None:
            raise RoutingNotFoundError(f"no exchange {source!r} in vhost {vhost!r}")
        x = v.exchanges.get(source)
        if x is None:
            raise RoutingNotFoundError(f"no exchange {source!r} in vhost {vhost!r}")
        is_exchange, name = dest
        if (name not in v.exchanges) if is_exchange else (name not in v.queues):
            kind = "exchange" if is_exchange else "queue"
            raise RoutingNotFoundError(f"no {kind} {name!r} in vhost {vhost!r}")
        bid: _BindingId = (dest, routing_key, _args_id(arguments))
        if x.add(bid, arguments):
            v.bound_to.setdefault(dest, set()).add((source, bid))

    def _unbind(
        self,
        vhost: str,
        dest: _Dest,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object] | None,
    ) -> None:
        if source == "" or (dest[0] and dest[1] == ""):
            raise RoutingValueError("operation not permitted on the default exchange")
        v = self._vhosts.get(vhost)
        x = v.exchanges.get(source) if v is not None else None
        if v is None or x is None:
            return
        bid: _BindingId = (dest, routing_key, _args_id(arguments))
        if x.remove(bid):
            self._unindex(v, source, bid)

    def bind_queue(
        self,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> None:
        """Bind ``queue`` to ``exchange``; an identical binding is a no-op.

        Raises:
            RoutingValueError: ``exchange`` is the default exchange, or a
                headers binding has an invalid ``x-match`` or argument value.
            RoutingNotFoundError: the exchange or queue is unknown (stale
                mirror: take a fresh snapshot).
        """
        self._bind(vhost, (False, queue), exchange, routing_key, arguments)

    def unbind_queue(
        self,
        vhost: str,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> None:
        """Remove one binding (same key and arguments); a missing binding is a no-op.

        Raises:
            RoutingValueError: ``exchange`` is the default exchange.
        """
        self._unbind(vhost, (False, queue), exchange, routing_key, arguments)

    def bind_exchange(
        self,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> None:
        """Bind exchange ``destination`` to exchange ``source`` (``exchange.bind``).

        Raises:
            RoutingValueError: either is the default exchange, or a headers
                binding has an invalid ``x-match`` or argument value.
            RoutingNotFoundError: either exchange is unknown.
        """
        self._bind(vhost, (True, destination), source, routing_key, arguments)

    def unbind_exchange(
        self,
        vhost: str,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, object] | None = None,
    ) -> None:
        """Remove one exchange-to-exchange binding; a missing one is a no-op.

        Raises:
            RoutingValueError: either is the default exchange.
        """
        self._unbind(vhost, (True, destination), source, routing_key, arguments)

    # --- policies -------------------------------------------------------------------

    def set_policies(self, vhost: str, policies: Sequence[Mapping[str, object]]) -> None:
        """Replace the vhost's policies (items as ``GET /api/policies`` returns them).

        Items carrying another ``"vhost"`` are ignored, so the whole
        ``/api/policies`` list may be passed.  Only ``alternate-exchange``
        matters for routing.

        Raises:
            RoutingValueError: an item lacks a string pattern, has a
                non-integer priority or a pattern Python cannot compile.
        """
        parsed = [_Policy.parse(p) for p in policies if p.get("vhost", vhost) == vhost]
        # Stable sort: equal priorities keep the given order, as lists:sort/2 does.
        parsed.sort(key=lambda p: -p.priority)
        v = self._vhost(vhost)
        v.policies = tuple(parsed)
        for name, x in v.exchanges.items():
            x.alternate_policy = v.policy_alternate(name)

    # --- queries --------------------------------------------------------------------

    def has_exchange(self, vhost: str, name: str) -> bool:
        """Whether the exchange exists (the default exchange always does)."""
        return name == "" or (vhost in self._vhosts and name in self._vhosts[vhost].exchanges)

    def has_queue(self, vhost: str, name: str) -> bool:
        """Whether the queue exists."""
        return vhost in self._vhosts and name in self._vhosts[vhost].queues

    def is_internal(self, vhost: str, name: str) -> bool:
        """Whether publishing to this exchange is refused because it is internal."""
        v = self._vhosts.get(vhost)
        x = v.exchanges.get(name) if v is not None else None
        return x is not None and x.internal

    def queues(self, vhost: str) -> frozenset[str]:
        """Names of the vhost's known queues."""
        v = self._vhosts.get(vhost)
        return frozenset(v.queues) if v is not None else _EMPTY

    def route(
        self,
        vhost: str,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, object] | None = None,
    ) -> frozenset[str]:
        """Names of the queues RabbitMQ enqueues this publish on.

        ``headers`` is the message's headers table as Python values.  Returns
        an empty set when the message is unroutable and when RabbitMQ would
        refuse the publish (unknown or internal exchange, a non-array
        ``CC``/``BCC``).  Never raises for message content.
        """
        v = self._vhosts.get(vhost)
        if v is None:
            return _EMPTY
        keys: Sequence[str] = (routing_key,)
        if headers and ("CC" in headers or "BCC" in headers):
            extra = _header_routes(headers)
            if extra is None:
                return _EMPTY
            keys = (routing_key, *extra)
        if exchange == "":
            queues = v.queues
            return frozenset(k for k in keys if k in queues)
        start = v.exchanges.get(exchange)
        if start is None or start.internal:
            return _EMPTY
        exchanges = v.exchanges
        if start.type != "headers" and start.alternate is None:
            # Fast path: a single exchange, queue-only bindings matched.
            dests = start.match(keys, {})
            if all(not is_x for is_x, _ in dests):
                return frozenset(name for _, name in dests)
        data: dict[bytes, Term] | None = None
        seen = {exchange}
        work = [start]
        found: set[str] = set()
        while work:
            x = work.pop()
            if x.type == "headers" and data is None:
                data = _headers_data(headers)
            matched = False
            for is_x, name in x.match(keys, data or {}):
                matched = True
                if not is_x:
                    found.add(name)
                elif name not in seen:
                    seen.add(name)
                    if name in exchanges:
                        work.append(exchanges[name])
            if not matched:
                alternate = x.alternate
                if alternate is not None and alternate not in seen:
                    seen.add(alternate)
                    if alternate in exchanges:
                        work.append(exchanges[alternate])
        return frozenset(found)

    # --- snapshots ------------------------------------------------------------------

    @classmethod
    def from_management(
        cls,
        exchanges: Sequence[Mapping[str, object]],
        queues: Sequence[Mapping[str, object]],
        bindings: Sequence[Mapping[str, object]],
        policies: Sequence[Mapping[str, object]] = (),
    ) -> RoutingTable:
        """Build a table from the management API's exchanges, queues, bindings and policies.

        The default exchange and its implicit bindings are skipped; the
        string ``"undefined"`` as a binding argument means void (see the
        module docstring).

        Raises:
            RoutingValueError: an item lacks a field or has a value of the
                wrong type, or a policy is unusable.
            RoutingNotFoundError: a binding names an exchange or queue absent
                from the lists (an inconsistent snapshot: retry).
        """
        table = cls()
        by_vhost: dict[str, list[Mapping[str, object]]] = {}
        for p in policies:
            by_vhost.setdefault(_field(p, "vhost"), []).append(p)
        for vhost, items in by_vhost.items():
            table.set_policies(vhost, items)
        for x in exchanges:
            name = _field(x, "name")
            if name == "":
                table._vhost(_field(x, "vhost"))
                continue
            table.declare_exchange(
                _field(x, "vhost"),
                name,
                _field(x, "type"),
                _mapping(x, "arguments"),
                internal=bool(x.get("internal", False)),
            )
        for q in queues:
            table.declare_queue(_field(q, "vhost"), _field(q, "name"), _mapping(q, "arguments"))
        for b in bindings:
            source = _field(b, "source")
            if source == "":
                continue
            vhost = _field(b, "vhost")
            dest = _field(b, "destination")
            key = _field(b, "routing_key")
            args = {
                k: (None if v == "undefined" else v)
                for k, v in (_mapping(b, "arguments") or {}).items()
            }
            kind = _field(b, "destination_type")
            if kind == "queue":
                table.bind_queue(vhost, dest, source, key, args)
            elif kind == "exchange":
                table.bind_exchange(vhost, dest, source, key, args)
            else:
                raise RoutingValueError(f"binding has unknown destination_type {kind!r}")
        return table

    def replace(self, other: RoutingTable) -> None:
        """Take over ``other``'s state in place (a fresh snapshot); ``other`` must not be reused."""
        self._vhosts = other._vhosts


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


def _field(item: Mapping[str, object], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise RoutingValueError(f"management item lacks string field {name!r}: {item!r}")
    return value


def _mapping(item: Mapping[str, object], name: str) -> Mapping[str, object] | None:
    value = item.get(name)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise RoutingValueError(f"management item field {name!r} is not an object: {item!r}")
    return value
