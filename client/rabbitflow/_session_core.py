"""What the sync and the asyncio session share, whatever drives them: the
acknowledge modes, the handler of the admin channel, and the application's
message for a delivery."""

from __future__ import annotations

from collections.abc import Callable

from ._destination import Destination
from ._exceptions import JMSException, StaleMessageError
from ._message import Message
from ._transport_base import Delivery

__all__ = [
    "AUTO_ACKNOWLEDGE",
    "CLIENT_ACKNOWLEDGE",
    "DUPS_OK_ACKNOWLEDGE",
    "SESSION_TRANSACTED",
    "AdminHandler",
    "check_current",
    "delivered_message",
]

SESSION_TRANSACTED = 0
AUTO_ACKNOWLEDGE = 1
CLIENT_ACKNOWLEDGE = 2
DUPS_OK_ACKNOWLEDGE = 3


class AdminHandler:
    """Events of a session's admin channel (declarations only)."""

    def on_confirm(self, tag: int, multiple: bool, ack: bool) -> None:
        """Not in confirm mode."""

    def on_flow(self, active: bool) -> None:
        """Nothing is published on the admin channel."""

    def on_deliver(self, delivery: Delivery) -> None:
        """Nothing is consumed on the admin channel."""

    def on_return(self, reply_code: int, reply_text: str, routing_key: str) -> None:
        """Nothing is published on the admin channel."""

    def on_channel_closed(self, error: JMSException) -> None:
        """A failed declaration closes it; the session opens another when needed."""


def delivered_message(
    delivery: Delivery, destination: Destination, acknowledger: Callable[[], None] | None
) -> Message:
    """The application's message for ``delivery``; ``acknowledger`` is what its
    ``acknowledge()`` calls (CLIENT_ACKNOWLEDGE sessions).

    Raises:
        MessageFormatError: a text body that cannot be decoded.
    """
    return Message.from_wire(
        delivery.body,
        delivery.properties,
        redelivered=delivery.redelivered,
        destination=destination,
        acknowledger=acknowledger,
    )


def check_current(generation: int, current: int) -> None:
    """Refuse to acknowledge a message of a channel lost since.

    Raises:
        StaleMessageError: ``generation`` is not the consumer's ``current`` one.
    """
    if generation != current:
        raise StaleMessageError(
            "cannot acknowledge: the message was delivered on a channel that was lost "
            "since (connection recovery); the broker delivers it again"
        )
