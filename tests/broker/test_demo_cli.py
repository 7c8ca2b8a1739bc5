"""rabbitflow-demo's command line: plain help, --version, and waiting for the gateway."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

import rabbitflow_broker
from rabbitflow_broker.cli.demo import build_parser, main, wait_for_gateway


def test_help_is_plain_text() -> None:
    text = build_parser().format_help()

    assert "``" not in text
    assert "rabbitflow-demo: the Qpid flow-control example, live." in text
    assert "--wait MS" in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])

    assert exited.value.code == 0
    assert capsys.readouterr().out == f"rabbitflow-demo {rabbitflow_broker.__version__}\n"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_gateway_that_never_answers_ends_the_demo_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"amqp://guest:secret@127.0.0.1:{_closed_port()}/%2F"

    assert main(["--gateway-url", url, "--wait", "0"]) == 1

    err = capsys.readouterr().err
    assert err.endswith("did not answer within 0 ms\n")
    assert "secret" not in err
    assert err.count("\n") == 1


@pytest.fixture
def late_amqp_listener() -> Iterator[tuple[int, threading.Event]]:
    """A port that answers the AMQP header with a Connection.Start-like frame,
    but only once the returned event is set."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    ready = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        ready.wait()
        listener.listen()
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(8)
                conn.sendall(b"\x01\x00\x00\x00\x00\x00\x04\x00\x0a\x00\x0a\xce")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port, ready
    finally:
        stop.set()
        ready.set()
        thread.join(5)
        listener.close()


def test_waiting_retries_until_the_gateway_answers(
    late_amqp_listener: tuple[int, threading.Event],
) -> None:
    port, ready = late_amqp_listener
    url = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
    assert not wait_for_gateway(url, 0.0)

    ready.set()

    assert wait_for_gateway(url, 30.0, interval_s=0.05)
