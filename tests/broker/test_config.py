"""Gateway options: defaults, sources and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from rabbitflow_broker.cli.config import ConfigError, GatewayConfig, load_config


def test_defaults_match_the_spec() -> None:
    config = load_config([], {})
    assert config.listen_address == ("127.0.0.1", 5673)
    assert config.admin_address == ("127.0.0.1", 15673)
    assert config.upstream == "amqp://localhost:5672"
    assert config.management_url == "http://localhost:15672"
    assert (config.default_flow_stop_threshold, config.default_flow_resume_threshold) == (80, 70)
    assert config.default_queue_limit == 104_857_600
    assert config.flow_enforcement_timeout == 5000
    assert (config.store_overfull_size, config.store_underfull_size) == (0, 0)
    assert config.log_format == "console"


def test_command_line_beats_environment_beats_file(tmp_path: Path) -> None:
    file = tmp_path / "gw.toml"
    file.write_text('listen = "0.0.0.0:1"\nadmin-listen = "127.0.0.1:2"\ndefault-queue-limit = 5\n')
    env = {"RABBITFLOW_BROKER_LISTEN": "0.0.0.0:3", "RABBITFLOW_BROKER_DEFAULT_QUEUE_LIMIT": "6"}
    config = load_config(["--config", str(file), "--listen", "0.0.0.0:4"], env)
    assert config.listen == "0.0.0.0:4"
    assert config.default_queue_limit == 6
    assert config.admin_listen == "127.0.0.1:2"


def test_bad_integer_names_the_option() -> None:
    with pytest.raises(ConfigError, match="--default-queue-limit"):
        load_config(["--default-queue-limit", "lots"], {})


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="RABBITFLOW_BROKER_FLOW_ENFORCEMENT_TIMEOUT"):
        load_config([], {"RABBITFLOW_BROKER_FLOW_ENFORCEMENT_TIMEOUT": "soon"})


def test_unknown_file_key_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "gw.toml"
    file.write_text("colour = 1\n")
    with pytest.raises(ConfigError, match="colour"):
        load_config(["--config", str(file)], {})


def test_resume_percentage_above_stop_is_refused() -> None:
    with pytest.raises(ConfigError, match="--default-flow-resume-threshold"):
        GatewayConfig(default_flow_stop_threshold=50, default_flow_resume_threshold=60)


def test_percentage_over_100_is_refused() -> None:
    with pytest.raises(ConfigError, match="--default-flow-stop-threshold"):
        GatewayConfig(default_flow_stop_threshold=120)


def test_store_underfull_above_overfull_is_refused() -> None:
    with pytest.raises(ConfigError, match="--store-underfull-size"):
        GatewayConfig(store_overfull_size=10, store_underfull_size=20)


def test_bad_listen_address_is_refused() -> None:
    with pytest.raises(ConfigError, match="--listen"):
        GatewayConfig(listen="nowhere")


def test_management_credentials_come_from_upstream_url() -> None:
    config = GatewayConfig(upstream="amqp://bob:s%40cret@rabbit:5672/")
    assert config.management_credentials == ("bob", "s@cret")
    assert config.upstream_address == ("rabbit", 5672)


def test_config_is_immutable() -> None:
    config = GatewayConfig()
    with pytest.raises(AttributeError):
        config.listen = "x:1"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("option", "value", "bad"),
    [
        ("upstream", "amqp://rabbit:abc", "amqp://rabbit:abc"),
        ("upstream", "amqps://rabbit:0", "amqps://rabbit:0"),
        ("upstream", "amqp://rabbit:5672, amqp://other:99999", "amqp://other:99999"),
        ("management-url", "http://rabbit:99999", "http://rabbit:99999"),
        ("management-url", "http://rabbit:15672,http://other:-1", "http://other:-1"),
    ],
)
def test_a_url_port_outside_1_to_65535_is_refused_naming_the_option_and_url(
    option: str, value: str, bad: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        GatewayConfig(**{option.replace("-", "_"): value})
    assert str(refused.value) == f"--{option}: the port of {bad!r} must be an integer in 1..65535"


def test_a_refused_url_port_does_not_show_the_password() -> None:
    with pytest.raises(ConfigError, match=r"'amqp://bob:\*\*\*@rabbit:abc'"):
        GatewayConfig(upstream="amqp://bob:s3cret@rabbit:abc")


def test_a_url_without_a_port_takes_the_default() -> None:
    config = GatewayConfig(upstream="amqp://rabbit,amqp://other:5673")
    assert config.upstream_addresses == [("rabbit", 5672), ("other", 5673)]


def test_a_bad_port_from_the_command_line_or_environment_is_a_config_error() -> None:
    # rabbitflow-broker prints a ConfigError in one line and exits 2, not serving.
    with pytest.raises(ConfigError, match=r"^--upstream: the port of 'amqp://rabbit:abc'"):
        load_config(["--upstream", "amqp://rabbit:abc"], {})
    with pytest.raises(ConfigError, match=r"^--management-url: the port of 'http://rabbit:99999'"):
        load_config([], {"RABBITFLOW_BROKER_MANAGEMENT_URL": "http://rabbit:99999"})
