from collections.abc import Iterator

import pytest

import rabbitflow
from rabbitflow._properties import ClientConfig, parse_opts


@pytest.fixture(autouse=True)
def clean_sources(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RABBITFLOW_OPTS", raising=False)
    monkeypatch.delenv("RABBITFLOW_URL", raising=False)
    saved = dict(rabbitflow.system_properties)
    rabbitflow.system_properties.clear()
    yield
    rabbitflow.system_properties.clear()
    rabbitflow.system_properties.update(saved)


def test_defaults_match_the_spec() -> None:
    spec = {
        "qpid.flow_control_wait_failure": 60000,
        "qpid.flow_control_wait_notify_period": 5000,
        "rabbitflow.producer_capacity": 100,
        "imqConsumerFlowLimit": 1000,
        "imqConsumerFlowThreshold": 50,
        "imqConnectionFlowLimitEnabled": False,
        "imqConnectionFlowLimit": 1000,
    }
    properties = ClientConfig.resolve().as_properties()
    assert {name: properties[name] for name in spec} == spec


def test_parse_opts_reads_d_tokens_and_ignores_others() -> None:
    opts = "-Xmx1g -Dqpid.flow_control_wait_failure=2000 '-Dx.y=a b' -Dflag"
    assert parse_opts(opts) == {
        "qpid.flow_control_wait_failure": "2000",
        "x.y": "a b",
        "flag": "true",
    }


def test_unbalanced_quotes_in_opts_name_the_variable() -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match="RABBITFLOW_OPTS"):
        parse_opts("-Da='b")


def test_environment_opts_take_effect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITFLOW_OPTS", "-Dqpid.flow_control_wait_failure=2000")
    assert rabbitflow.ConnectionFactory().config.wait_failure_ms == 2000


def test_system_properties_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITFLOW_OPTS", "-Dqpid.flow_control_wait_failure=2000")
    rabbitflow.system_properties["qpid.flow_control_wait_failure"] = "4000"
    assert rabbitflow.ConnectionFactory().config.wait_failure_ms == 4000


def test_factory_properties_override_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITFLOW_OPTS", "-Dqpid.flow_control_wait_failure=2000")
    rabbitflow.system_properties["qpid.flow_control_wait_failure"] = 4000
    factory = rabbitflow.ConnectionFactory(properties={"qpid.flow_control_wait_failure": 7000})
    assert factory.config.wait_failure_ms == 7000


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("qpid.flow_control_wait_failure", "soon", "whole number"),
        ("qpid.flow_control_wait_notify_period", -1, "negative"),
        ("imqConsumerFlowThreshold", 101, "at most 100"),
        ("imqConsumerFlowLimit", 0, "at least 1"),
        ("imqConnectionFlowLimitEnabled", "maybe", "true or false"),
        ("rabbitflow.producer_capacity", True, "number"),
    ],
)
def test_bad_value_fails_at_factory_creation_naming_the_property(
    name: str, value: object, why: str
) -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match=why) as info:
        rabbitflow.ConnectionFactory(properties={name: value})
    assert name in str(info.value)
    assert info.value.name == name


@pytest.mark.parametrize("name", ["qpid.flow_control_wait_failur", "imqConsumerFlowLimits"])
def test_unknown_qpid_or_imq_name_is_refused(name: str) -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match="unknown property") as info:
        rabbitflow.ConnectionFactory(properties={name: 1})
    assert name in str(info.value)


def test_bad_value_in_the_environment_fails_at_factory_creation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RABBITFLOW_OPTS", "-DimqConsumerFlowThreshold=150")
    with pytest.raises(rabbitflow.InvalidPropertyError, match="imqConsumerFlowThreshold"):
        rabbitflow.ConnectionFactory()


def test_unrelated_names_are_ignored() -> None:
    config = ClientConfig.resolve({"java.awt.headless": "true"})
    assert config == ClientConfig()


def test_boolean_accepts_common_spellings() -> None:
    on = ClientConfig.resolve({"imqConnectionFlowLimitEnabled": "TRUE"})
    off = ClientConfig.resolve({"imqConnectionFlowLimitEnabled": "0"})
    assert (on.connection_flow_limit_enabled, off.connection_flow_limit_enabled) == (True, False)


def test_config_is_immutable() -> None:
    config = ClientConfig()
    with pytest.raises(AttributeError):
        config.wait_failure_ms = 1  # type: ignore[misc]


def test_config_repr_is_readable() -> None:
    assert "wait_failure_ms=60000" in repr(ClientConfig())


def test_url_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RABBITFLOW_URL", "amqp://u:p@broker:5673/%2F")
    assert rabbitflow.ConnectionFactory().url == "amqp://u:p@broker:5673/%2F"


def test_url_defaults_to_the_local_broker() -> None:
    assert rabbitflow.ConnectionFactory().url == "amqp://guest:guest@localhost:5672/%2F"


def test_factory_repr_hides_the_password() -> None:
    assert "secret" not in repr(rabbitflow.ConnectionFactory("amqp://u:secret@h/"))


def test_threshold_count_is_a_percentage_of_the_limit() -> None:
    config = ClientConfig.resolve({"imqConsumerFlowLimit": 10, "imqConsumerFlowThreshold": 50})
    assert config.consumer_threshold_count == 5
