"""Exchanges, policies and virtual hosts of the routing mirror (pure).

``_Exchange`` keeps one exchange's bindings with the indexes that match a
message fast (direct keys, fanout set, topic trie, compiled headers
patterns); ``_Policy`` is one policy as far as routing cares
(``alternate-exchange``); ``_VHost`` holds a virtual host's exchanges,
queues and policies.  :class:`~rabbitflow_broker.engine.routing.RoutingTable` is
built on them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rabbitflow_broker.engine.routing_match import (
    RoutingValueError,
    Term,
    _BindingId,
    _Dest,
    _HeadersPattern,
    _split_topic_key,
    _topic_match,
    _TopicNode,
)

__all__ = ["PREDECLARED_EXCHANGES"]

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
    __slots__ = ("alone", "bound_to", "exchanges", "policies", "queues")

    def __init__(self) -> None:
        self.exchanges: dict[str, _Exchange] = {
            name: _Exchange(name, type_, None, internal)
            for name, (type_, internal) in PREDECLARED_EXCHANGES.items()
        }
        self.queues: dict[str, dict[str, object]] = {}
        # queue -> the route of a publish straight to it, made once (the
        # commonest route; keeps the same set for every such publish).
        self.alone: dict[str, frozenset[str]] = {}
        self.policies: tuple[_Policy, ...] = ()
        # Reverse index: destination -> bindings pointing at it, for deletes.
        self.bound_to: dict[_Dest, set[tuple[str, _BindingId]]] = {}

    def policy_alternate(self, exchange: str) -> str | None:
        for policy in self.policies:
            if policy.applies_to_exchanges and policy.pattern.search(exchange):
                return policy.alternate
        return None
