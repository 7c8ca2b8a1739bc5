"""The SDK's own publish-frame encoder writes exactly what pika would."""

from __future__ import annotations

import pika
import pika.frame
import pika.spec
import pytest

from rabbitflow._message import WireProperties
from rabbitflow._transport_base import to_pika as _to_pika
from rabbitflow._transport_frames import PublishEncoder as _PublishEncoder


def _pika_frames(
    channel: int, exchange: str, key: str, body: bytes, props: WireProperties, *, body_max: int
) -> bytes:
    frames = [
        pika.frame.Method(channel, pika.spec.Basic.Publish(exchange=exchange, routing_key=key)),
        pika.frame.Header(channel, len(body), _to_pika(props)),
    ]
    frames += [
        pika.frame.Body(channel, body[i : i + body_max]) for i in range(0, len(body), body_max)
    ]
    return b"".join(f.marshal() for f in frames)


@pytest.mark.parametrize(
    "props",
    [
        WireProperties(),
        WireProperties(delivery_mode=1),
        # One-entry tables take the encoder's short path (send() adds the
        # JMSTimestamp header to nearly every message); ints either side of
        # the 32-bit boundary, and a bool that must not take it.
        WireProperties(headers={"JMSTimestamp": 1_795_558_452_781}),
        WireProperties(headers={"n": 7}),
        WireProperties(headers={"n": -(1 << 31)}),
        WireProperties(headers={"n": 1 << 31}),
        WireProperties(headers={"n": -(1 << 31) - 1}),
        WireProperties(headers={"ok": True}),
        WireProperties(
            content_type="text/plain",
            content_encoding="utf-8",
            headers={"JMSXGroupID": "g", "n": 7, "big": 1 << 40, "ok": True},
            delivery_mode=2,
            priority=4,
            correlation_id="c-1",
            reply_to="queue://replies",
            expiration="5000",
            message_id="ID:1234",
            timestamp=1_700_000_000,
            type="order",
        ),
    ],
)
@pytest.mark.parametrize("body", [b"", b"x" * 256, b"y" * 10_000])
def test_encoded_publish_matches_pika(props: WireProperties, body: bytes) -> None:
    encoder = _PublishEncoder()
    for _ in range(2):  # the second time from the caches
        encoded = encoder.encode(3, "ex", "orders", body, props, mandatory=False, body_max=4088)
        assert encoded == _pika_frames(3, "ex", "orders", body, props, body_max=4088)


def test_a_routing_key_over_255_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="short string"):
        _PublishEncoder().encode(
            1, "", "k" * 256, b"", WireProperties(), mandatory=False, body_max=4088
        )
