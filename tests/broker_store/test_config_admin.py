"""Gateway options added for issue 4: admin credentials and the store quota."""

from __future__ import annotations

import pytest

from rabbitflow_broker.cli.config import ConfigError, GatewayConfig, load_config


def test_admin_auth_defaults_to_none_without_users() -> None:
    assert GatewayConfig().admin_auth == "none"


def test_admin_auth_defaults_to_users_when_users_are_given() -> None:
    config = GatewayConfig(admin_users="ann:pw1, bob:pw2")
    assert config.admin_auth == "users"
    assert config.admin_credentials == {"ann": "pw1", "bob": "pw2"}


def test_non_loopback_admin_listen_without_auth_is_refused() -> None:
    with pytest.raises(ConfigError, match="non-loopback address only with credentials"):
        GatewayConfig(admin_listen="0.0.0.0:15673")


def test_non_loopback_admin_listen_with_users_is_accepted() -> None:
    assert GatewayConfig(admin_listen="0.0.0.0:15673", admin_users="a:b").admin_auth == "users"


def test_non_loopback_admin_listen_with_rabbitmq_auth_is_accepted() -> None:
    assert GatewayConfig(admin_listen="10.0.0.1:1", admin_auth="rabbitmq").admin_auth == "rabbitmq"


def test_ipv6_loopback_admin_listen_needs_no_auth() -> None:
    assert GatewayConfig(admin_listen="[::1]:15673").admin_auth == "none"


def test_users_auth_without_users_is_refused() -> None:
    with pytest.raises(ConfigError, match="--admin-auth users: needs --admin-users"):
        GatewayConfig(admin_auth="users")


def test_malformed_admin_users_is_refused() -> None:
    with pytest.raises(ConfigError, match="--admin-users: expected USER:PASS"):
        GatewayConfig(admin_users="ann")


def test_admin_users_come_from_the_environment() -> None:
    config = load_config([], {"RABBITFLOW_BROKER_ADMIN_USERS": "ann:pw"})
    assert config.admin_credentials == {"ann": "pw"}


def test_admin_auth_option_is_parsed() -> None:
    assert load_config(["--admin-auth", "rabbitmq"], {}).admin_auth == "rabbitmq"


def test_store_overfull_below_underfull_is_refused_at_start_up() -> None:
    with pytest.raises(ConfigError, match="--store-overfull-size 1,000 is below"):
        load_config(["--store-overfull-size", "1000", "--store-underfull-size", "2000"], {})


def test_store_path_and_poll_interval_options() -> None:
    config = load_config(["--store-path", "/var/lib/rabbitmq", "--store-poll-interval", "250"], {})
    assert (config.store_path, config.store_poll_interval) == ("/var/lib/rabbitmq", 250)
