"""TLS settings: ``ssl_context`` and the ``rabbitflow.ssl.*`` properties are
validated when the factory is created; TLS failures become ``TLSError``."""

from __future__ import annotations

import ssl
from pathlib import Path

import pika.exceptions
import pytest
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorTransportSetupError,
)

import rabbitflow
from rabbitflow._transport import translate_error

TLS_URL = "amqps://guest:guest@broker.example:5671/%2F"


def _garbage(tmp_path: Path, name: str) -> str:
    path = tmp_path / name
    path.write_text("not a PEM file\n")
    return str(path)


def test_ssl_context_is_used_as_given_for_amqps() -> None:
    context = ssl.create_default_context()
    assert rabbitflow.ConnectionFactory(TLS_URL, ssl_context=context).ssl_context is context


def test_amqps_without_settings_verifies_against_the_system_cas() -> None:
    context = rabbitflow.ConnectionFactory(TLS_URL).ssl_context
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname


def test_amqp_url_has_no_tls() -> None:
    assert rabbitflow.ConnectionFactory("amqp://localhost/").ssl_context is None


def test_ssl_context_with_an_amqp_url_is_refused() -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match=r"^ssl_context: needs an amqps://"):
        rabbitflow.ConnectionFactory("amqp://localhost/", ssl_context=ssl.create_default_context())


def test_ssl_properties_with_an_amqp_url_are_refused() -> None:
    cafile = ssl.get_default_verify_paths().cafile
    assert cafile is not None
    with pytest.raises(rabbitflow.InvalidPropertyError, match="need an amqps:// URL"):
        rabbitflow.ConnectionFactory(
            "amqp://localhost/", properties={"rabbitflow.ssl.ca_file": cafile}
        )


def test_missing_ca_file_names_the_property(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(
        rabbitflow.InvalidPropertyError, match=r"^rabbitflow\.ssl\.ca_file: no such"
    ):
        rabbitflow.ConnectionFactory(TLS_URL, properties={"rabbitflow.ssl.ca_file": missing})


def test_unreadable_ca_file_names_the_property(tmp_path: Path) -> None:
    with pytest.raises(
        rabbitflow.InvalidPropertyError, match=r"^rabbitflow\.ssl\.ca_file: cannot load"
    ):
        rabbitflow.ConnectionFactory(
            TLS_URL, properties={"rabbitflow.ssl.ca_file": _garbage(tmp_path, "ca.pem")}
        )


def test_bad_client_certificate_names_both_properties(tmp_path: Path) -> None:
    properties = {
        "rabbitflow.ssl.cert_file": _garbage(tmp_path, "cert.pem"),
        "rabbitflow.ssl.key_file": _garbage(tmp_path, "key.pem"),
    }
    with pytest.raises(
        rabbitflow.InvalidPropertyError,
        match=r"^rabbitflow\.ssl\.cert_file / rabbitflow\.ssl\.key_file: cannot load",
    ):
        rabbitflow.ConnectionFactory(TLS_URL, properties=properties)


def test_key_file_without_cert_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match=r"^rabbitflow\.ssl\.key_file: needs"):
        rabbitflow.ConnectionFactory(
            TLS_URL, properties={"rabbitflow.ssl.key_file": _garbage(tmp_path, "key.pem")}
        )


@pytest.mark.parametrize("value", ["", "   ", 5])
def test_empty_or_non_text_path_is_refused(value: object) -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match="expected a file path"):
        rabbitflow.ConnectionFactory(TLS_URL, properties={"rabbitflow.ssl.ca_file": value})


def test_ssl_properties_come_from_rabbitflow_opts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "ca.pem"
    monkeypatch.setenv("RABBITFLOW_OPTS", f"-Drabbitflow.ssl.ca_file={missing}")
    with pytest.raises(rabbitflow.InvalidPropertyError, match=r"rabbitflow\.ssl\.ca_file"):
        rabbitflow.ConnectionFactory(TLS_URL)


def test_an_untrusted_broker_certificate_is_a_tls_error() -> None:
    # As pika reports it: the connection workflow's phase error around ssl's.
    cause = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cause.verify_message = "unable to get local issuer certificate"
    error = AMQPConnectionWorkflowFailed([AMQPConnectorTransportSetupError(cause)])
    translated = translate_error(pika.exceptions.AMQPConnectionError(error))
    assert isinstance(translated, rabbitflow.TLSError)
    assert str(translated).startswith(
        "TLS certificate verification failed: unable to get local issuer certificate"
    )


def test_another_tls_failure_is_a_tls_error() -> None:
    error = AMQPConnectionWorkflowFailed(
        [AMQPConnectorTransportSetupError(ssl.SSLError(1, "tlsv13 alert certificate required"))]
    )
    translated = translate_error(error)
    assert isinstance(translated, rabbitflow.TLSError)
    assert "TLS handshake failed" in str(translated)
