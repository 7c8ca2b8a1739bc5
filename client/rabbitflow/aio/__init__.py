"""rabbitflow for asyncio: the same flow-controlled JMS shapes, with coroutines.

>>> import asyncio
>>> from rabbitflow import aio
>>> async def main() -> None:
...     async with await aio.ConnectionFactory().create_connection() as connection:
...         session = connection.create_session()
...         producer = await session.create_producer(await session.create_queue("orders"))
...         await producer.send(session.create_text_message("hello"))
>>> asyncio.run(main())  # doctest: +SKIP

``await producer.send(message)`` suspends (never blocking the loop) under
broker flow control, with the sync SDK's properties, log lines, timeouts
and exceptions: the rules are the same pure state machines, driven from the
event loop instead of an I/O thread.
"""

from ._connection import Connection, ConnectionFactory
from ._consumer import MessageConsumer
from ._producer import MessageProducer
from ._session import Session

__all__ = ["Connection", "ConnectionFactory", "MessageConsumer", "MessageProducer", "Session"]
