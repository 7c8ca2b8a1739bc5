import inspect
from pathlib import Path

import rabbitflow
from rabbitflow import aio


def test_public_names_are_pinned() -> None:
    assert sorted(rabbitflow.__all__) == sorted(
        [
            "AUTO_ACKNOWLEDGE",
            "CLIENT_ACKNOWLEDGE",
            "DUPS_OK_ACKNOWLEDGE",
            "LOGGER_NAME",
            "NON_PERSISTENT",
            "PERSISTENT",
            "SESSION_TRANSACTED",
            "BrokerError",
            "BytesMessage",
            "ClientConfig",
            "Connection",
            "ConnectionFactory",
            "ConnectionLostError",
            "ConsumerFlowStats",
            "Destination",
            "FlowControlTimeoutError",
            "IllegalStateError",
            "InvalidDestinationError",
            "InvalidPropertyError",
            "JMSException",
            "Message",
            "MessageConsumer",
            "MessageFormatError",
            "MessageProducer",
            "ProtocolError",
            "Queue",
            "Session",
            "StaleMessageError",
            "TLSError",
            "TextMessage",
            "Topic",
            "TransactionRolledBackError",
            "UnconfirmedMessagesError",
            "__version__",
            "json_formatter",
            "system_properties",
        ]
    )


def test_every_public_name_exists() -> None:
    missing = [name for name in rabbitflow.__all__ if not hasattr(rabbitflow, name)]
    assert missing == []


def test_public_classes_claim_the_package_namespace() -> None:
    assert rabbitflow.MessageProducer.__module__.startswith("rabbitflow.")


def test_every_exception_is_a_jms_exception() -> None:
    errors = [
        getattr(rabbitflow, name)
        for name in rabbitflow.__all__
        if isinstance(getattr(rabbitflow, name), type)
        and issubclass(getattr(rabbitflow, name), Exception)
    ]
    assert errors
    assert all(issubclass(error, rabbitflow.JMSException) for error in errors)


def test_invalid_property_error_is_also_a_value_error() -> None:
    assert issubclass(rabbitflow.InvalidPropertyError, ValueError)


def test_acknowledge_modes_and_delivery_modes_are_distinct() -> None:
    modes = {
        rabbitflow.AUTO_ACKNOWLEDGE,
        rabbitflow.CLIENT_ACKNOWLEDGE,
        rabbitflow.DUPS_OK_ACKNOWLEDGE,
        rabbitflow.SESSION_TRANSACTED,
    }
    assert len(modes) == 4
    assert (rabbitflow.PERSISTENT, rabbitflow.NON_PERSISTENT) == (2, 1)


def test_the_asyncio_names_are_pinned_and_coroutines_where_they_wait() -> None:
    assert sorted(aio.__all__) == [
        "Connection",
        "ConnectionFactory",
        "MessageConsumer",
        "MessageProducer",
        "Session",
    ]
    assert inspect.iscoroutinefunction(aio.ConnectionFactory.create_connection)
    assert inspect.iscoroutinefunction(aio.MessageProducer.send)
    assert inspect.iscoroutinefunction(aio.MessageConsumer.receive)
    assert inspect.iscoroutinefunction(aio.Session.create_producer)
    assert not inspect.iscoroutinefunction(aio.Session.create_text_message)


def test_only_the_transport_modules_import_pika() -> None:
    package = Path(rabbitflow.__file__).parent
    importers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(
            line.startswith(("import pika", "from pika")) for line in path.read_text().splitlines()
        )
    )
    assert importers == [
        "_transport.py",
        "_transport_base.py",
        "_transport_channel.py",
        "_transport_frames.py",
        "aio/_transport.py",
    ]
