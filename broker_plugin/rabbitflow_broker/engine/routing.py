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

from collections.abc import Mapping, Sequence

from rabbitflow_broker.engine.routing_exchange import (
    PREDECLARED_EXCHANGES,
    _Exchange,
    _Policy,
    _VHost,
)
from rabbitflow_broker.engine.routing_match import (
    RoutingError,
    RoutingNotFoundError,
    RoutingValueError,
    Term,
    _args_id,
    _BindingId,
    _Dest,
    _header_routes,
    _headers_data,
)

__all__ = [
    "PREDECLARED_EXCHANGES",
    "RoutingError",
    "RoutingNotFoundError",
    "RoutingTable",
    "RoutingValueError",
]

_EMPTY: frozenset[str] = frozenset()


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
        v = self._vhost(vhost)
        v.queues[name] = dict(arguments or {})
        if name not in v.alone:
            v.alone[name] = frozenset((name,))

    def delete_queue(self, vhost: str, name: str) -> None:
        """Remove a queue and its bindings; unknown queues are a no-op."""
        v = self._vhosts.get(vhost)
        if v is None or v.queues.pop(name, None) is None:
            return
        del v.alone[name]
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

    def has_vhost(self, vhost: str) -> bool:
        """Whether the vhost exists: listed by the snapshot (even without a
        queue or exchange of its own) or holding a declare relayed since."""
        return vhost in self._vhosts

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
        if exchange == "" and headers is None:  # the commonest publish: straight to a queue
            return v.alone.get(routing_key, _EMPTY)
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
