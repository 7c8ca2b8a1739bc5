"""Keeping the gateway's routing mirror in step with what RabbitMQ confirmed (pure).

A client's synchronous request (``queue.declare``, ``queue.bind``,
``exchange.delete``...) changes routing only once RabbitMQ answers it with
its ``-ok`` (or at once for ``nowait``).  :data:`UPDATES` maps each request
to the function that applies its confirmed effect to the routing table and
the queue registry; :data:`OK_OF` names the answer each request waits for.

The functions get the decoded arguments of the request (as
:func:`~rabbitflow_broker.engine.amqp.decode_args` returns them), the decoded
answer (``None`` for ``nowait``) and the channel's last declared queue
(AMQP's "empty queue name means the last one declared").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final, Protocol

from rabbitflow_broker.engine import amqp
from rabbitflow_broker.engine.amqp import text
from rabbitflow_broker.engine.routing import RoutingError, RoutingTable

__all__ = ["NOWAIT_AT", "OK_OF", "UPDATES", "Registry", "apply"]


class Registry(Protocol):
    """What the mirror updates besides the routing table: the queue registry."""

    routing: RoutingTable
    routing_version: int

    def knows_queue(self, vhost: str, name: str) -> bool: ...

    def queue_declared(
        self, vhost: str, name: str, arguments: Mapping[str, object] | None
    ) -> None: ...

    def queue_deleted(self, vhost: str, name: str) -> None: ...

    def purged(self, vhost: str, queue: str, count: int) -> None: ...


#: The answer each synchronous request waits for.
OK_OF: Final = {
    amqp.QUEUE_DECLARE: amqp.QUEUE_DECLARE_OK,
    amqp.QUEUE_BIND: amqp.QUEUE_BIND_OK,
    amqp.QUEUE_UNBIND: amqp.QUEUE_UNBIND_OK,
    amqp.QUEUE_PURGE: amqp.QUEUE_PURGE_OK,
    amqp.QUEUE_DELETE: amqp.QUEUE_DELETE_OK,
    amqp.EXCHANGE_DECLARE: amqp.EXCHANGE_DECLARE_OK,
    amqp.EXCHANGE_DELETE: amqp.EXCHANGE_DELETE_OK,
    amqp.EXCHANGE_BIND: amqp.EXCHANGE_BIND_OK,
    amqp.EXCHANGE_UNBIND: amqp.EXCHANGE_UNBIND_OK,
    amqp.BASIC_CONSUME: amqp.BASIC_CONSUME_OK,
    amqp.BASIC_CANCEL: amqp.BASIC_CANCEL_OK,
    amqp.BASIC_GET: amqp.BASIC_GET_OK,
}

#: Index of the ``nowait`` bit in each request's arguments (absent: none).
NOWAIT_AT: Final = {
    amqp.QUEUE_DECLARE: 6,
    amqp.QUEUE_BIND: 4,
    amqp.QUEUE_PURGE: 2,
    amqp.QUEUE_DELETE: 4,
    amqp.EXCHANGE_DECLARE: 7,
    amqp.EXCHANGE_DELETE: 3,
    amqp.EXCHANGE_BIND: 4,
    amqp.EXCHANGE_UNBIND: 4,
    amqp.BASIC_CONSUME: 6,
    amqp.BASIC_CANCEL: 1,
}

Args = list[object]
Update = Callable[[Registry, str, Args, Args | None, str], bool]


def _table(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def _queue(args: Args, last_queue: str) -> str:
    return text(args[1]) or last_queue


def _declare_queue(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    name = text(reply[0]) if reply is not None else text(args[1])
    if args[2]:  # passive: learn the queue only when the mirror lacks it
        if not reg.knows_queue(vhost, name):
            reg.routing.declare_queue(vhost, name, None)
            reg.queue_declared(vhost, name, None)
        return True
    arguments = _table(args[7])
    reg.routing.declare_queue(vhost, name, arguments)
    reg.queue_declared(vhost, name, arguments)
    return True


def _bind_queue(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    reg.routing.bind_queue(vhost, _queue(args, last), text(args[2]), text(args[3]), _table(args[5]))
    return True


def _unbind_queue(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    reg.routing.unbind_queue(
        vhost, _queue(args, last), text(args[2]), text(args[3]), _table(args[4])
    )
    return True


def _purge(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    if reply is not None:
        count = reply[0]
        reg.purged(vhost, _queue(args, last), count if isinstance(count, int) else 0)
    return False


def _delete_queue(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    queue = _queue(args, last)
    reg.routing.delete_queue(vhost, queue)
    reg.queue_deleted(vhost, queue)
    return True


def _declare_exchange(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    if args[3]:  # passive
        return False
    reg.routing.declare_exchange(
        vhost, text(args[1]), text(args[2]), _table(args[8]), internal=bool(args[6])
    )
    return True


def _delete_exchange(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    reg.routing.delete_exchange(vhost, text(args[1]))
    return True


def _bind_exchange(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    reg.routing.bind_exchange(vhost, text(args[1]), text(args[2]), text(args[3]), _table(args[5]))
    return True


def _unbind_exchange(reg: Registry, vhost: str, args: Args, reply: Args | None, last: str) -> bool:
    reg.routing.unbind_exchange(vhost, text(args[1]), text(args[2]), text(args[3]), _table(args[5]))
    return True


#: Request -> how its confirmed effect changes the mirror (True: routing changed).
UPDATES: Final[dict[int, Update]] = {
    amqp.QUEUE_DECLARE: _declare_queue,
    amqp.QUEUE_BIND: _bind_queue,
    amqp.QUEUE_UNBIND: _unbind_queue,
    amqp.QUEUE_PURGE: _purge,
    amqp.QUEUE_DELETE: _delete_queue,
    amqp.EXCHANGE_DECLARE: _declare_exchange,
    amqp.EXCHANGE_DELETE: _delete_exchange,
    amqp.EXCHANGE_BIND: _bind_exchange,
    amqp.EXCHANGE_UNBIND: _unbind_exchange,
}


def apply(
    reg: Registry, vhost: str, request: int, args: Args, reply: Args | None, *, last_queue: str
) -> str | None:
    """Apply a confirmed request to the mirror; returns why it could not, or None.

    A request the mirror cannot follow (it is stale) is left to the next
    management snapshot, which repairs it.
    """
    update = UPDATES.get(request)
    if update is None:
        return None
    try:
        if update(reg, vhost, args, reply, last_queue):
            reg.routing_version += 1
    except RoutingError as exc:
        return str(exc)
    return None
