"""Start-up, outages and administrator stops, without RabbitMQ.

The management API here is either a closed port (refuses at once) or a
socket that accepts and never answers.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import resource
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from rabbitflow_broker.engine.flow import Thresholds
from rabbitflow_broker.server.persistence import FileThresholdStore
from rabbitflow_broker.server.service import GatewayService, OutageLog, loop_exception_handler
from rabbitflow_broker.server.service_io import DescriptorWatch
from tests.admin.conftest import Serve, seen_vhosts

JSON = {"Content-Type": "application/json"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def refusing_management() -> str:
    return f"http://127.0.0.1:{_closed_port()}"


@pytest_asyncio.fixture
async def silent_management() -> AsyncIterator[str]:
    """An HTTP address that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for writer in held:
        writer.close()
    server.close()


def test_outage_log_says_lost_once_then_reminds_after_the_interval() -> None:
    outage = OutageLog(reminder=30.0)

    said = [outage.failed(t) for t in (0.0, 1.0, 29.0, 30.0, 31.0, 59.0, 60.0)]

    assert said == ["lost", None, None, "still lost", None, None, "still lost"]


def test_outage_log_reports_the_outage_length_once_when_it_ends() -> None:
    outage = OutageLog()
    outage.failed(10.0)

    assert outage.succeeded(13.5) == pytest.approx(3.5)
    assert outage.succeeded(14.0) is None


def test_outage_log_says_nothing_when_nothing_failed() -> None:
    assert OutageLog().succeeded(5.0) is None


@pytest.mark.asyncio
async def test_management_outage_is_one_lost_line_not_one_per_poll(
    make_service: Callable[..., GatewayService], refusing_management: str
) -> None:
    service = make_service(management_url=refusing_management)
    with capture_logs() as logs:
        await service.refresh_routing()
        for _ in range(5):
            await service.reconcile_once()
            await service.measure_store()
    await service.management.close()

    warnings = [entry["event"] for entry in logs if entry["log_level"] == "warning"]
    assert warnings == ["upstream lost"]


@pytest.mark.asyncio
async def test_routing_snapshot_after_an_outage_logs_upstream_back(
    make_service: Callable[..., GatewayService], refusing_management: str
) -> None:
    service = make_service(management_url=refusing_management)
    await service.refresh_routing()
    with capture_logs() as logs:
        service._management_ok()
        service._management_ok()
    await service.management.close()

    assert [entry["event"] for entry in logs] == ["upstream back"]


@pytest.mark.asyncio
async def test_queue_lookup_answers_503_when_the_management_api_is_silent(
    make_service: Callable[..., GatewayService], serve: Serve, silent_management: str
) -> None:
    service = make_service(management_url=silent_management)
    async with serve(service) as client:
        response = await client.get("/api/queues/%2F/unknown")
        body = await response.json()

    assert response.status == 503
    assert "did not answer" in body["error"]


@pytest.mark.asyncio
async def test_producer_stop_of_an_unseen_vhost_answers_503_when_the_management_api_is_silent(
    make_service: Callable[..., GatewayService], serve: Serve, silent_management: str
) -> None:
    service = make_service(management_url=silent_management)
    async with serve(service) as client:
        response = await client.post("/api/producers/stop", json={"vhost": "billing"})
        body = await response.json()

    assert response.status == 503
    assert "did not answer" in body["error"]
    assert service.gateway.admin_stops() == []


@pytest.mark.asyncio
async def test_ready_endpoint_reports_the_reason_until_ready(
    make_service: Callable[..., GatewayService], serve: Serve
) -> None:
    service = make_service()
    service.gateway.ready_error = "gateway not ready: management API silent"
    async with serve(service) as client:
        waiting = await client.get("/api/ready")
        waiting_body = await waiting.json()
        service.gateway.ready_error = None
        ready = await client.get("/api/ready")

    assert waiting.status == 503
    assert waiting_body["reason"] == "gateway not ready: management API silent"
    assert ready.status == 200


@pytest.mark.asyncio
async def test_producer_stop_is_written_to_the_state_file(
    make_service: Callable[..., GatewayService], serve: Serve, tmp_path: Path
) -> None:
    service = make_service(state_file=str(tmp_path / "state.json"))
    seen_vhosts(service, "/", "billing")
    async with serve(service) as client:
        await client.post("/api/producers/stop", json={"vhost": "/", "queue": "q"})
        await client.post("/api/producers/stop", json={"vhost": "billing"})
        await client.post("/api/producers/start", json={"vhost": "billing"})

    stored = await FileThresholdStore(tmp_path / "state.json").load_stops()
    assert stored == [("/", "q")]


@pytest.mark.asyncio
async def test_stops_and_thresholds_share_the_state_file_without_losing_either(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    store = FileThresholdStore(path)
    await store.save_stop((None, None), True)
    await store.save(("/", "q"), Thresholds(stop_count=10, resume_count=5))

    again = FileThresholdStore(path)
    assert await again.load_stops() == [(None, None)]
    assert list(await again.load()) == [("/", "q")]
    assert json.loads(path.read_text())["stops"] == [{"vhost": None, "queue": None}]


def test_accept_failing_for_lack_of_file_descriptors_is_logged_as_such() -> None:
    loop = asyncio.new_event_loop()
    try:
        with capture_logs() as logs:
            # What asyncio's accept loop reports when accept() hits EMFILE.
            loop_exception_handler(
                loop,
                {
                    "message": "socket.accept() out of system resource",
                    "exception": OSError(errno.EMFILE, "Too many open files"),
                },
            )
    finally:
        loop.close()

    assert [entry["event"] for entry in logs] == [
        "too many open files: connections are not accepted until some close "
        "(raise the limit: ulimit -n, or LimitNOFILE= in a systemd unit)"
    ]


def test_a_full_descriptor_table_is_named_when_tried() -> None:
    """The last descriptor may go to a socket the relay does not see (the
    management API's): the service tries the table every second."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    watch = DescriptorWatch(limit=64, quiet_s=3600)
    held: list[int] = []
    with capture_logs() as logs:
        assert not watch.full()
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
        try:
            while True:
                try:
                    held.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            assert watch.full()
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [entry["event"].split(":")[0] for entry in logs] == ["too many open files"]


class _SocketTransport(asyncio.BaseTransport):
    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._sock if name == "socket" else default


def test_the_socket_that_takes_the_last_descriptor_is_named_once_per_quiet_period() -> None:
    """uvloop drops a client it cannot accept without a word: the relay shows
    the watch each socket, and the one numbered limit - 1 (the lowest free
    number is always taken, so none is left) is logged."""
    with socket.socket() as low, socket.socket() as high:
        watch = DescriptorWatch(limit=high.fileno() + 1, quiet_s=3600)
        with capture_logs() as logs:
            watch.opened(_SocketTransport(low))  # a descriptor above it is still free
            watch.opened(_SocketTransport(high))  # the last one
            watch.opened(_SocketTransport(high))  # within the quiet period
        assert [(entry["event"].split(":")[0], entry["limit"]) for entry in logs] == [
            ("too many open files", high.fileno() + 1)
        ]
        with capture_logs() as unlimited:
            DescriptorWatch(limit=None).opened(_SocketTransport(high))
        assert unlimited == []


def test_a_client_listener_the_event_loop_closed_is_opened_again(
    make_service: Callable[..., GatewayService],
) -> None:
    """uvloop closes a listener, silently, when libuv's accept callback
    reports an error (descriptors ran out): the watch opens it again on the
    same port, and says so."""
    import uvloop

    async def scenario() -> list[dict[str, object]]:
        service = make_service()
        service._server = await service._listen("127.0.0.1", 0, None)
        service.port = service._server.sockets[0].getsockname()[1]
        service._server.close()  # as uvloop does on the listen callback's error
        with capture_logs() as logs:
            await service._relisten()
        _reader, writer = await asyncio.open_connection("127.0.0.1", service.port)
        writer.close()
        assert service._server.sockets[0].getsockname()[1] == service.port
        service._server.close()
        await service.management.close()
        return logs

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        logs = runner.run(scenario())
    assert [entry["event"] for entry in logs] == [
        "client listener closed by the event loop: listening again"
    ]
