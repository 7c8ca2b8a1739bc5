"""A throwaway RabbitMQ node's ports stay clear of the kernel's ephemeral ports."""

from __future__ import annotations

import socket
from pathlib import Path

from rabbitflow_broker.server.rabbitmq_node import _node_ports


def _ephemeral_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_node_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    # An outgoing connection made while a node is stopped takes its port from
    # the ephemeral range; the node's own ports must not be there, or its
    # restart can find one taken.
    low, _ = _ephemeral_range()
    for _ in range(50):
        ports = _node_ports(3)
        assert len(set(ports)) == 3
        assert all(port < low for port in ports)
        assert not set(ports) & {5672, 15672, 25672, 4369}
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind(("127.0.0.1", port))
