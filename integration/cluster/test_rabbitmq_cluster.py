"""Two gateways in front of a three-node RabbitMQ cluster; the quorum queue's
leader node is stopped mid-stream.

The nodes are throwaway ones (own names, ports and data, one Erlang
cookie), joined with ``rabbitmqctl join_cluster``.  Both gateways list the
three nodes in ``--upstream`` and ``--management-url``.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from integration.broker._depth import DepthWatcher
from integration.broker.conftest import wait_for
from integration.cluster._members import Member, cluster_name
from integration.conftest import Broker
from rabbitflow_broker.server.rabbitmq_node import NodeError, RabbitMQNode, rabbitmq_available

STOP, RESUME = 200, 100
BATCH = 20
CAPACITY = 10
#: Enough that every producer is still sending when the leader stops (checked;
#: the stop takes seconds).
PER_PRODUCER = 600


@pytest.fixture
def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[RabbitMQNode]]:
    if not rabbitmq_available():
        pytest.fail("rabbitmq-server is not installed: apt-get install rabbitmq-server")
    cookie = uuid.uuid4().hex.upper()
    nodes = [
        RabbitMQNode(management=True, base_dir=tmp_path_factory.mktemp(f"n{i}"), cookie=cookie)
        for i in range(3)
    ]
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda node: node.start(), nodes))
        for node in nodes[1:]:
            node.join(nodes[0])
        wait_for(lambda: _running_nodes(nodes[0]) == 3, timeout=60, what="3 running nodes")
    except NodeError as exc:
        _close(nodes)
        pytest.fail(f"RabbitMQ cluster did not form: {exc}")
    yield nodes
    _close(nodes)


def _close(nodes: list[RabbitMQNode]) -> None:
    """Stop the nodes at once (``rabbitmqctl stop`` takes seconds each)."""
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda node: node.close(), nodes))


def _api(node: RabbitMQNode, path: str) -> object:
    request = urllib.request.Request(f"{node.management_url}{path}")
    request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")  # guest:guest
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _running_nodes(node: RabbitMQNode) -> int:
    nodes = _api(node, "/api/nodes")
    assert isinstance(nodes, list)
    return sum(1 for n in nodes if n.get("running"))


class Producer(threading.Thread):
    """An SDK producer; ``accepted`` holds every body send() returned for."""

    def __init__(self, url: str, queue: str, pid: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue, self.pid = url, queue, pid
        self.accepted: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        import rabbitflow

        try:
            factory = rabbitflow.ConnectionFactory(
                self.url,
                properties={"qpid.flow_control_wait_failure": 60_000},
            )
            with factory.create_connection() as connection:
                session = connection.create_session()
                producer = session.create_producer(
                    session.create_queue(self.queue), capacity=CAPACITY
                )
                for seq in range(PER_PRODUCER):
                    body = f"{self.pid}:{seq}"
                    producer.send(session.create_text_message(body))
                    self.accepted.append(body)
                session.close()
        except BaseException as exc:
            self.error = exc


class Consumer(threading.Thread):
    """Consumes straight from a node that stays up, slowly, with acks."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.bodies: list[str] = []
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.url))
                channel = connection.channel()
                channel.basic_qos(prefetch_count=1)
                for method, _props, body in channel.consume(self.queue, inactivity_timeout=0.05):
                    if self.halt.is_set():
                        break
                    if method is not None:
                        self.bodies.append(body.decode())
                        channel.basic_ack(method.delivery_tag)
                        time.sleep(0.003)
                connection.close()
            except pika.exceptions.AMQPError:
                time.sleep(0.2)  # the quorum queue elects a leader: consume again


@pytest.mark.slow
def test_leader_node_stopped_clients_reconnect_nothing_lost_bound_holds(
    rabbitmq_cluster: list[RabbitMQNode], tmp_path: Path, unique_name: Callable[[str], str]
) -> None:
    nodes = rabbitmq_cluster
    upstream = ",".join(node.url for node in nodes)
    management = ",".join(str(node.management_url) for node in nodes)
    broker = Broker(upstream, management)
    name = cluster_name()
    gateways = [
        Member(broker, tmp_path, name, i, cluster_batch=BATCH, cluster_lease=1000).start()
        for i in range(2)
    ]
    try:
        queue = unique_name("qq")
        connection = pika.BlockingConnection(pika.URLParameters(gateways[0].url))
        connection.channel().queue_declare(
            queue,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "qpid.flow_stop_count": STOP,
                "qpid.flow_resume_count": RESUME,
            },
        )
        connection.close()
        info = _api(nodes[0], f"/api/queues/%2F/{quote(queue)}")
        assert isinstance(info, dict)
        leader = next(node for node in nodes if node.name == info["leader"])
        survivor = next(node for node in nodes if node is not leader)
        # Raw connections through a gateway land on each node in turn: one
        # of them is on the leader's node.
        raw = [pika.BlockingConnection(pika.URLParameters(gateways[1].url)) for _ in nodes]
        watcher = DepthWatcher(Broker(survivor.url, survivor.management_url), queue)
        watcher.start()
        producers = [Producer(g.url, queue, f"{g.index}.{i}") for g in gateways for i in range(2)]
        consumer = Consumer(survivor.url, queue)
        consumer.start()
        for producer in producers:
            producer.start()
        # Past the stop threshold (the consumer is slower than the producers).
        wait_for(lambda: all(len(p.accepted) > 100 for p in producers), timeout=60, what="flowing")
        # Held by flow control at the consumer's pace, none has finished yet.
        assert all(len(p.accepted) < PER_PRODUCER for p in producers), "too few messages"
        leader.stop()  # graceful: its connections get 320 naming it, the queue a new leader
        closed = []
        for conn in raw:
            try:
                conn.process_data_events(time_limit=1)
                conn.close()
            except pika.exceptions.ConnectionClosedByBroker as exc:
                closed.append((exc.reply_code, exc.reply_text))
            except pika.exceptions.AMQPError:
                conn.close()
        assert closed, "no client connection was on the stopped node"
        assert all(code == 320 for code, _ in closed), closed
        # RabbitMQ's own close (a clean stop), naming the node that went away.
        gone = f"upstream node 127.0.0.1:{leader.amqp_port} went away: CONNECTION_FORCED - "
        assert all(text.startswith(gone) and "shutdown" in text for _, text in closed), closed
        for producer in producers:
            producer.join(180)
            assert not producer.is_alive(), f"producer {producer.pid} still sending"
            assert producer.error is None, f"producer {producer.pid}: {producer.error!r}"
        accepted = {body for p in producers for body in p.accepted}
        wait_for(
            lambda: accepted <= set(consumer.bodies),
            timeout=120,
            interval=0.2,
            what="every accepted message consumed",
        )
        consumer.halt.set()
        consumer.join(10)
        peak = watcher.finish()
        bound = STOP + len(producers) * CAPACITY + len(gateways) * BATCH
        assert peak <= bound, f"peak depth {peak} over {bound}"
        # The flow state went on: the queue is known with its thresholds on both.
        for gateway in gateways:
            status, body = gateway.http("GET", f"/api/queues/%2F/{quote(queue)}")
            assert status == 200, body
            assert body["flowStopCount"] == STOP
            assert body["flowStoppedCount"] >= 1
    finally:
        for gateway in gateways:
            gateway.stop()
        for gateway in gateways:
            print(f"--- gateway {gateway.index} ---\n{gateway.log()[-4000:]}")
