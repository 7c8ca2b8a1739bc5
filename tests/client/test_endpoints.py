"""Several broker URLs: the accepted forms, the errors for bad ones, and the
round-robin order connecting and recovery try them in."""

from __future__ import annotations

import pytest

import rabbitflow
from rabbitflow import aio
from rabbitflow._endpoints import Endpoints, all_failed, parse_urls, redact

A = "amqp://guest:guest@a:5673/%2F"
B = "amqp://guest:guest@b:5673/%2F"
C = "amqp://c"


@pytest.mark.parametrize(
    "given",
    [
        [A, B, C],
        (A, B, C),
        f"{A},{B},{C}",
        f" {A} , {B},{C} ",
        f"failover:({A},{B},{C})",
        f"FAILOVER:( {A}, {B}, {C} )",
    ],
    ids=["list", "tuple", "commas", "commas-spaced", "failover", "failover-spaced"],
)
def test_every_form_gives_the_urls_in_order(given: str | list[str]) -> None:
    assert parse_urls(given) == (A, B, C)


def test_one_url_is_a_list_of_one() -> None:
    assert parse_urls(A) == (A,)
    assert parse_urls("failover:(amqp://a)") == ("amqp://a",)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "no broker URL"),
        ("failover:()", "no broker URL"),
        (f"{A},,{B}", "an empty item"),
        (f"{A},", "an empty item"),
        ("failover:amqp://a", "failover:(url,url,...)"),
        ("failover:(amqp://a", "failover:(url,url,...)"),
        ("failover:(amqp://a)?failover.maxReconnectAttempts=3", "not supported"),
        ("http://a", "amqp:// or amqps://"),
        ("a:5672", "amqp:// or amqps://"),
        ("amqp://", "no host"),
        ("amqp://a:port", "bad port"),
        (["amqp://a", "amqps://b"], "mixes amqp:// and amqps://"),
        ([A, 5672], "a list of strings"),
        (5672, "a list of strings"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_url(given: object, says: str) -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match=r"^url: ") as caught:
        parse_urls(given)  # type: ignore[arg-type]
    assert isinstance(caught.value, ValueError)
    assert says in str(caught.value)


def test_errors_never_show_a_password() -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError) as caught:
        parse_urls("failover:(amqp://u:secret@a)?x=1secret")
    assert "secret@" not in str(caught.value)
    assert redact("amqp://u:secret@a:1/v") == "amqp://u:***@a:1/v"


def test_rotation_is_round_robin_from_the_first() -> None:
    endpoints = Endpoints([A, B, C])
    assert endpoints.current == A
    assert [endpoints.next() for _ in range(7)] == [A, B, C, A, B, C, A]
    assert endpoints.current == A


def test_one_round_tries_each_once_from_the_next_and_tracks_the_current() -> None:
    endpoints = Endpoints([A, B, C])
    endpoints.next()
    seen = []
    for url in endpoints.one_round():
        seen.append((url, endpoints.current))
    assert seen == [(B, B), (C, C), (A, A)]


def test_all_failed_names_every_url_or_raises_the_error_that_retrying_cannot_fix() -> None:
    down = rabbitflow.ConnectionLostError("refused")
    assert all_failed([(A, down)]) is down
    both = all_failed([(A, down), (B, rabbitflow.ConnectionLostError("timed out"))])
    assert isinstance(both, rabbitflow.ConnectionLostError)
    assert "none of 2 broker URLs" in str(both)
    assert "a:5673/%2F: refused" in str(both)
    assert "b:5673/%2F: timed out" in str(both)
    assert "guest:guest" not in str(both)
    refused = rabbitflow.BrokerError("ACCESS_REFUSED", reply_code=403)
    assert all_failed([(A, down), (B, refused)]) is refused


def test_the_factories_take_every_form_and_keep_the_first_as_url() -> None:
    for factory in (
        rabbitflow.ConnectionFactory(f"failover:({A},{B})"),
        aio.ConnectionFactory([A, B]),
    ):
        assert factory.urls == (A, B)
        assert factory.url == A
        assert "guest:guest" not in repr(factory)


def test_the_factories_refuse_bad_urls_at_creation() -> None:
    with pytest.raises(rabbitflow.InvalidPropertyError, match="no broker URL"):
        rabbitflow.ConnectionFactory([])
    with pytest.raises(rabbitflow.InvalidPropertyError, match="mixes"):
        aio.ConnectionFactory("amqp://a,amqps://b")
