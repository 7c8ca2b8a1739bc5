"""RoutingTable: one RabbitMQ 3.10 routing rule per test."""

from __future__ import annotations

import decimal

import pytest

from rabbitflow_broker.engine import routing
from rabbitflow_broker.engine.routing import (
    RoutingNotFoundError,
    RoutingTable,
    RoutingValueError,
)

V = "/"


def table(*queues: str) -> RoutingTable:
    t = RoutingTable()
    for q in queues:
        t.declare_queue(V, q)
    return t


def one(kind: str, key: str = "k", args: dict[str, object] | None = None) -> RoutingTable:
    """Exchange "x" of ``kind`` with queue "q" bound by ``key``/``args``."""
    t = table("q")
    t.declare_exchange(V, "x", kind)
    t.bind_queue(V, "q", "x", key, args)
    return t


def test_public_names_are_pinned() -> None:
    assert sorted(routing.__all__) == [
        "PREDECLARED_EXCHANGES",
        "RoutingError",
        "RoutingNotFoundError",
        "RoutingTable",
        "RoutingValueError",
    ]


# --- default exchange ----------------------------------------------------------------


def test_default_exchange_routes_to_queue_named_by_key() -> None:
    assert table("orders").route(V, "", "orders") == {"orders"}


def test_a_queue_deleted_and_declared_again_is_routed_to_again() -> None:
    t = table("orders")
    first = t.route(V, "", "orders")
    assert t.route(V, "", "orders") is first  # one set per queue, not one per publish
    t.delete_queue(V, "orders")
    assert t.route(V, "", "orders") == frozenset()
    t.declare_queue(V, "orders")
    assert t.route(V, "", "orders") == {"orders"}


def test_default_exchange_drops_missing_queue() -> None:
    assert table("orders").route(V, "", "nope") == frozenset()


def test_default_exchange_applies_cc_and_bcc() -> None:
    t = table("a", "b", "c")
    assert t.route(V, "", "a", {"CC": ["b"], "BCC": ["c", "zz"]}) == {"a", "b", "c"}


def test_default_exchange_ignores_alternate_exchange_policy() -> None:
    t = table("q")
    t.declare_exchange(V, "ae", "fanout")
    t.bind_queue(V, "q", "ae", "")
    t.set_policies(V, [{"name": "p", "pattern": ".*", "definition": {"alternate-exchange": "ae"}}])
    assert t.route(V, "", "nope") == frozenset()


def test_binding_to_default_exchange_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        table("q").bind_queue(V, "q", "", "q")


def test_unbinding_from_default_exchange_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        table("q").unbind_queue(V, "q", "", "q")


def test_default_exchange_cannot_be_exchange_binding_destination() -> None:
    t = table()
    t.declare_exchange(V, "x", "fanout")
    with pytest.raises(RoutingValueError):
        t.bind_exchange(V, "", "x", "")


def test_deleting_default_exchange_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        table().delete_exchange(V, "")


# --- predeclared exchanges ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ],
)
def test_amq_exchanges_exist_in_every_vhost_with_their_type(name: str, kind: str) -> None:
    t = RoutingTable()
    t.declare_queue("other", "q")
    t.bind_queue("other", "q", name, "k", {"x-match": "any", "h": 1})
    expected = {"q"} if kind in ("fanout", "direct", "topic") else frozenset()
    assert t.route("other", name, "k") == expected


def test_amq_rabbitmq_trace_is_internal_topic() -> None:
    t = table("q")
    t.bind_queue(V, "q", "amq.rabbitmq.trace", "#")
    assert t.is_internal(V, "amq.rabbitmq.trace")
    assert t.route(V, "amq.rabbitmq.trace", "publish.x") == frozenset()


def test_unknown_exchange_routes_nowhere() -> None:
    assert table("q").route(V, "nope", "q") == frozenset()


def test_unknown_vhost_routes_nowhere() -> None:
    assert table("q").route("elsewhere", "", "q") == frozenset()


def test_vhosts_are_isolated() -> None:
    t = table("q")
    assert t.route("other", "", "q") == frozenset()


# --- direct and fanout -----------------------------------------------------------------


def test_direct_routes_on_equal_key() -> None:
    assert one("direct", "k").route(V, "x", "k") == {"q"}


def test_direct_ignores_other_key() -> None:
    assert one("direct", "k").route(V, "x", "K") == frozenset()


def test_direct_ignores_binding_arguments() -> None:
    assert one("direct", "k", {"x-match": "any", "a": 1}).route(V, "x", "k") == {"q"}


def test_direct_routes_each_queue_once_for_several_bindings() -> None:
    t = one("direct", "k")
    t.bind_queue(V, "q", "x", "k", {"other": "args"})
    t.bind_queue(V, "q", "x", "j")
    assert t.route(V, "x", "k", {"CC": ["j"]}) == {"q"}


def test_fanout_ignores_key() -> None:
    assert one("fanout", "k").route(V, "x", "anything") == {"q"}


def test_fanout_reaches_every_bound_queue() -> None:
    t = one("fanout")
    t.declare_queue(V, "r")
    t.bind_queue(V, "r", "x", "")
    assert t.route(V, "x", "") == {"q", "r"}


# --- topic -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("#", "", True),
        ("#", "a.b", True),
        ("*", "", False),
        ("", "", True),
        ("", "a", False),
        ("*", ".", False),
        ("*.*", ".", True),
        ("a.*", "a.", True),
        ("#.#", "", True),
        ("#.#", "a.b.c", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("#.a", "a", True),
        ("#.a.#", "x.a.y", True),
        ("*.#.*", "a", False),
        ("*.#.*", "a.b", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
    ],
)
def test_topic_matching(pattern: str, key: str, matches: bool) -> None:
    expected = {"q"} if matches else frozenset()
    assert one("topic", pattern).route(V, "x", key) == expected


def test_topic_wildcard_in_routing_key_is_literal_for_literal_pattern() -> None:
    assert one("topic", "a.b").route(V, "x", "a.*") == frozenset()


def test_topic_unbind_prunes_only_that_pattern() -> None:
    t = one("topic", "a.#")
    t.bind_queue(V, "q", "x", "a.b")
    t.unbind_queue(V, "q", "x", "a.#")
    assert (t.route(V, "x", "a.b"), t.route(V, "x", "a.c")) == ({"q"}, frozenset())


def test_topic_result_reflects_binding_added_after_a_route() -> None:
    t = one("topic", "a")
    assert t.route(V, "x", "b") == frozenset()
    t.bind_queue(V, "q", "x", "b")
    assert t.route(V, "x", "b") == {"q"}


# --- headers ---------------------------------------------------------------------------


def hdr(args: dict[str, object], headers: dict[str, object] | None) -> bool:
    return one("headers", "", args).route(V, "x", "", headers) == {"q"}


def test_headers_all_needs_every_key() -> None:
    assert not hdr({"x-match": "all", "a": 1, "b": 2}, {"a": 1})


def test_headers_all_matches_when_every_key_equal() -> None:
    assert hdr({"x-match": "all", "a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3})


def test_headers_default_mode_is_all() -> None:
    assert not hdr({"a": 1, "b": 2}, {"a": 1})


def test_headers_any_needs_one_key() -> None:
    assert hdr({"x-match": "any", "a": 1, "b": 2}, {"b": 2})


def test_headers_any_fails_on_wrong_values() -> None:
    assert not hdr({"x-match": "any", "a": 1}, {"a": 2})


def test_headers_all_with_no_keys_matches_everything() -> None:
    assert hdr({"x-match": "all"}, None)


def test_headers_any_with_no_keys_matches_nothing() -> None:
    assert not hdr({"x-match": "any"}, {"a": 1})


def test_headers_x_keys_ignored_in_all() -> None:
    assert hdr({"x-match": "all", "x-h": 1}, {})


def test_headers_x_keys_ignored_in_any() -> None:
    assert not hdr({"x-match": "any", "x-h": 1}, {"x-h": 1})


def test_headers_all_with_x_matches_x_keys() -> None:
    assert not hdr({"x-match": "all-with-x", "x-h": 1}, {})


def test_headers_any_with_x_matches_x_keys() -> None:
    assert hdr({"x-match": "any-with-x", "x-h": 1}, {"x-h": 1})


def test_headers_void_binding_value_tests_presence() -> None:
    assert hdr({"x-match": "all", "a": None}, {"a": "whatever"})


def test_headers_void_binding_value_needs_presence() -> None:
    assert not hdr({"x-match": "all", "a": None}, {"b": 1})


def test_headers_string_equals_byte_array() -> None:
    assert hdr({"a": "v"}, {"a": b"v"})


def test_headers_integer_equals_float_of_same_value() -> None:
    assert hdr({"a": 1}, {"a": 1.0})


def test_headers_boolean_is_not_integer() -> None:
    assert not hdr({"a": 1}, {"a": True})


def test_headers_string_is_not_integer() -> None:
    assert not hdr({"a": "1"}, {"a": 1})


def test_headers_decimal_compares_by_value() -> None:
    assert hdr({"a": decimal.Decimal("1.50")}, {"a": decimal.Decimal("1.5")})


def test_headers_array_element_types_matter() -> None:
    assert not hdr({"a": ["v"]}, {"a": [b"v"]})


def test_headers_equal_arrays_match() -> None:
    assert hdr({"a": [1, "v"]}, {"a": [1, "v"]})


def test_headers_cannot_see_bcc() -> None:
    assert not hdr({"x-match": "any", "BCC": None}, {"BCC": ["z"]})


def test_headers_can_see_cc() -> None:
    assert hdr({"x-match": "any", "CC": None}, {"CC": ["z"]})


def test_headers_invalid_x_match_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        one("headers", "", {"x-match": "some"})


def test_headers_unbind_needs_same_arguments() -> None:
    t = one("headers", "", {"a": 1})
    t.unbind_queue(V, "q", "x", "", {"a": 2})
    assert t.route(V, "x", "", {"a": 1}) == {"q"}


def test_headers_unbind_with_same_arguments_in_other_order() -> None:
    t = one("headers", "", {"x-match": "any", "a": 1, "b": 2})
    t.unbind_queue(V, "q", "x", "", {"b": 2, "a": 1, "x-match": "any"})
    assert t.route(V, "x", "", {"a": 1}) == frozenset()


# --- CC and BCC ------------------------------------------------------------------------


def test_cc_adds_routing_keys() -> None:
    assert one("direct", "k").route(V, "x", "other", {"CC": ["k"]}) == {"q"}


def test_bcc_adds_routing_keys() -> None:
    assert one("topic", "k.*").route(V, "x", "other", {"BCC": ["k.1"]}) == {"q"}


def test_cc_ignores_non_string_elements() -> None:
    assert one("direct", "k").route(V, "x", "other", {"CC": [b"k", 1]}) == frozenset()


def test_non_array_cc_makes_publish_route_nowhere() -> None:
    assert one("direct", "k").route(V, "x", "k", {"CC": "k"}) == frozenset()


def test_cc_applies_through_exchange_bindings() -> None:
    t = one("direct", "k")
    t.declare_exchange(V, "src", "fanout")
    t.bind_exchange(V, "x", "src", "")
    assert t.route(V, "src", "zz", {"CC": ["k"]}) == {"q"}


# --- exchange-to-exchange bindings --------------------------------------------------------


def chain() -> RoutingTable:
    """a -(k)-> b -(fanout)-> q ; q also bound to a by key "direct"."""
    t = table("q")
    t.declare_exchange(V, "a", "direct")
    t.declare_exchange(V, "b", "fanout")
    t.bind_exchange(V, "b", "a", "k")
    t.bind_queue(V, "q", "b", "")
    return t


def test_exchange_binding_forwards() -> None:
    assert chain().route(V, "a", "k") == {"q"}


def test_exchange_binding_respects_source_key() -> None:
    assert chain().route(V, "a", "j") == frozenset()


def test_exchange_bindings_are_transitive() -> None:
    t = chain()
    t.declare_exchange(V, "top", "topic")
    t.bind_exchange(V, "a", "top", "#")
    assert t.route(V, "top", "k") == {"q"}


def test_exchange_binding_cycle_terminates() -> None:
    t = chain()
    t.bind_exchange(V, "a", "b", "")
    assert t.route(V, "a", "k") == {"q"}


def test_queue_reached_twice_is_reported_once() -> None:
    t = chain()
    t.bind_queue(V, "q", "a", "k")
    assert t.route(V, "a", "k") == {"q"}


def test_internal_exchange_is_routed_through() -> None:
    t = table("q")
    t.declare_exchange(V, "a", "fanout")
    t.declare_exchange(V, "i", "fanout", internal=True)
    t.bind_exchange(V, "i", "a", "")
    t.bind_queue(V, "q", "i", "")
    assert t.route(V, "a", "") == {"q"}


def test_internal_exchange_cannot_be_published_to() -> None:
    t = table("q")
    t.declare_exchange(V, "i", "fanout", internal=True)
    t.bind_queue(V, "q", "i", "")
    assert t.route(V, "i", "") == frozenset()


# --- alternate exchanges ---------------------------------------------------------------


def with_ae(kind: str = "direct", via: str = "argument") -> RoutingTable:
    """x (bound to q by "k") has AE "ae", a fanout to queue "lost"."""
    t = table("q", "lost")
    t.declare_exchange(V, "ae", "fanout")
    t.bind_queue(V, "lost", "ae", "")
    args = {"alternate-exchange": "ae"} if via == "argument" else None
    t.declare_exchange(V, "x", kind, args)
    if via == "policy":
        t.set_policies(
            V, [{"name": "p", "pattern": "^x$", "definition": {"alternate-exchange": "ae"}}]
        )
    t.bind_queue(V, "q", "x", "k")
    return t


def test_alternate_exchange_gets_unroutable_message() -> None:
    assert with_ae().route(V, "x", "j") == {"lost"}


def test_alternate_exchange_unused_when_routed() -> None:
    assert with_ae().route(V, "x", "k") == {"q"}


def test_alternate_exchange_from_policy() -> None:
    assert with_ae(via="policy").route(V, "x", "j") == {"lost"}


def test_alternate_exchange_argument_beats_policy() -> None:
    t = with_ae()
    t.declare_exchange(V, "other", "fanout")
    t.declare_queue(V, "o")
    t.bind_queue(V, "o", "other", "")
    t.set_policies(
        V, [{"name": "p", "pattern": "x", "definition": {"alternate-exchange": "other"}}]
    )
    assert t.route(V, "x", "j") == {"lost"}


def test_alternate_exchanges_chain() -> None:
    t = table("end")
    t.declare_exchange(V, "ae2", "fanout")
    t.bind_queue(V, "end", "ae2", "")
    t.declare_exchange(V, "ae1", "direct", {"alternate-exchange": "ae2"})
    t.declare_exchange(V, "x", "direct", {"alternate-exchange": "ae1"})
    assert t.route(V, "x", "k") == {"end"}


def test_alternate_exchange_cycle_terminates() -> None:
    t = table()
    t.declare_exchange(V, "a", "direct", {"alternate-exchange": "b"})
    t.declare_exchange(V, "b", "direct", {"alternate-exchange": "a"})
    assert t.route(V, "a", "k") == frozenset()


def test_missing_alternate_exchange_is_ignored() -> None:
    t = table()
    t.declare_exchange(V, "x", "direct", {"alternate-exchange": "ghost"})
    assert t.route(V, "x", "k") == frozenset()


def test_alternate_exchange_declared_later_is_used() -> None:
    t = table("lost")
    t.declare_exchange(V, "x", "direct", {"alternate-exchange": "ae"})
    t.declare_exchange(V, "ae", "fanout")
    t.bind_queue(V, "lost", "ae", "")
    assert t.route(V, "x", "k") == {"lost"}


def test_alternate_exchange_of_exchange_binding_destination_is_consulted() -> None:
    t = with_ae()
    t.declare_exchange(V, "src", "fanout")
    t.bind_exchange(V, "x", "src", "")
    assert t.route(V, "src", "j") == {"lost"}


def test_exchange_binding_match_suppresses_alternate_exchange() -> None:
    t = with_ae()
    t.declare_exchange(V, "dead", "direct")
    t.bind_exchange(V, "dead", "x", "j")
    assert t.route(V, "x", "j") == frozenset()


def test_self_binding_match_suppresses_alternate_exchange() -> None:
    t = with_ae()
    t.bind_exchange(V, "x", "x", "j")
    assert t.route(V, "x", "j") == frozenset()


def test_alternate_exchange_sees_cc_keys() -> None:
    t = table("q")
    t.declare_exchange(V, "ae", "direct")
    t.bind_queue(V, "q", "ae", "c")
    t.declare_exchange(V, "x", "direct", {"alternate-exchange": "ae"})
    assert t.route(V, "x", "k", {"CC": ["c"]}) == {"q"}


def test_internal_alternate_exchange_is_used() -> None:
    t = table("lost")
    t.declare_exchange(V, "ae", "fanout", internal=True)
    t.bind_queue(V, "lost", "ae", "")
    t.declare_exchange(V, "x", "direct", {"alternate-exchange": "ae"})
    assert t.route(V, "x", "k") == {"lost"}


# --- policies --------------------------------------------------------------------------


def policy(name: str, pattern: str, priority: int, ae: str | None, apply_to: str = "all"):  # type: ignore[no-untyped-def]
    definition = {"alternate-exchange": ae} if ae else {"max-length": 1}
    return {
        "vhost": V,
        "name": name,
        "pattern": pattern,
        "apply-to": apply_to,
        "priority": priority,
        "definition": definition,
    }


def ae_table() -> RoutingTable:
    t = table("a1", "a2")
    for name, queue in (("ae1", "a1"), ("ae2", "a2")):
        t.declare_exchange(V, name, "fanout")
        t.bind_queue(V, queue, name, "")
    t.declare_exchange(V, "orders", "direct")
    return t


def test_policy_highest_priority_wins() -> None:
    t = ae_table()
    t.set_policies(V, [policy("low", "ord", 1, "ae1"), policy("high", "ord", 5, "ae2")])
    assert t.route(V, "orders", "k") == {"a2"}


def test_policy_without_alternate_shadows_lower_priority_one() -> None:
    t = ae_table()
    t.set_policies(V, [policy("low", "ord", 1, "ae1"), policy("high", "ord", 5, None)])
    assert t.route(V, "orders", "k") == frozenset()


def test_policy_for_queues_does_not_apply_to_exchanges() -> None:
    t = ae_table()
    t.set_policies(V, [policy("q", "ord", 1, "ae1", apply_to="queues")])
    assert t.route(V, "orders", "k") == frozenset()


def test_queue_only_policy_does_not_shadow() -> None:
    t = ae_table()
    t.set_policies(
        V, [policy("low", "ord", 1, "ae1"), policy("high", "ord", 5, None, apply_to="queues")]
    )
    assert t.route(V, "orders", "k") == {"a1"}


def test_policy_pattern_is_a_search_not_a_full_match() -> None:
    t = ae_table()
    t.set_policies(V, [policy("p", "der", 1, "ae1")])
    assert t.route(V, "orders", "k") == {"a1"}


def test_policy_pattern_anchors_are_respected() -> None:
    t = ae_table()
    t.set_policies(V, [policy("p", "^der", 1, "ae1")])
    assert t.route(V, "orders", "k") == frozenset()


def test_policy_of_another_vhost_is_ignored() -> None:
    t = ae_table()
    t.set_policies(V, [{**policy("p", "ord", 1, "ae1"), "vhost": "other"}])
    assert t.route(V, "orders", "k") == frozenset()


def test_policy_applies_to_exchange_declared_after_it() -> None:
    t = ae_table()
    t.set_policies(V, [policy("p", "^late$", 1, "ae1")])
    t.declare_exchange(V, "late", "topic")
    assert t.route(V, "late", "k") == {"a1"}


def test_clearing_policies_removes_policy_alternate() -> None:
    t = ae_table()
    t.set_policies(V, [policy("p", "ord", 1, "ae1")])
    t.set_policies(V, [])
    assert t.route(V, "orders", "k") == frozenset()


def test_bad_policy_pattern_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        ae_table().set_policies(V, [policy("p", "(", 1, "ae1")])


# --- deletes and stale mirrors -----------------------------------------------------------


def test_deleting_queue_removes_its_bindings() -> None:
    t = one("fanout")
    t.delete_queue(V, "q")
    t.declare_queue(V, "q")
    assert t.route(V, "x", "") == frozenset()


def test_deleting_exchange_removes_bindings_to_it() -> None:
    t = chain()
    t.delete_exchange(V, "b")
    t.declare_exchange(V, "b", "fanout")
    t.bind_queue(V, "q", "b", "")
    assert t.route(V, "a", "k") == frozenset()


def test_deleting_exchange_removes_its_bindings() -> None:
    t = one("fanout")
    t.delete_exchange(V, "x")
    t.declare_exchange(V, "x", "fanout")
    assert t.route(V, "x", "") == frozenset()


def test_deleting_exchange_bound_to_itself() -> None:
    t = one("fanout")
    t.bind_exchange(V, "x", "x", "")
    t.delete_exchange(V, "x")
    assert not t.has_exchange(V, "x")


def test_deleting_unknown_entities_is_a_no_op() -> None:
    t = table()
    t.delete_queue(V, "ghost")
    t.delete_exchange(V, "ghost")
    assert t.queues(V) == frozenset()


def test_redeclaring_exchange_keeps_bindings() -> None:
    t = one("headers", "", {"a": 1})
    t.declare_exchange(V, "x", "headers")
    assert t.route(V, "x", "", {"a": 1}) == {"q"}


def test_redeclaring_exchange_with_other_type_is_refused() -> None:
    with pytest.raises(RoutingValueError):
        one("direct").declare_exchange(V, "x", "fanout")


def test_redeclaring_queue_keeps_bindings() -> None:
    t = one("fanout")
    t.declare_queue(V, "q", {"x-max-length": 1})
    assert t.route(V, "x", "") == {"q"}


def test_binding_to_unknown_queue_is_not_found() -> None:
    t = table()
    t.declare_exchange(V, "x", "fanout")
    with pytest.raises(RoutingNotFoundError):
        t.bind_queue(V, "ghost", "x", "")


def test_binding_from_unknown_exchange_is_not_found() -> None:
    with pytest.raises(RoutingNotFoundError):
        table("q").bind_queue(V, "q", "ghost", "")


def test_unbinding_unknown_binding_is_a_no_op() -> None:
    t = one("direct", "k")
    t.unbind_queue(V, "q", "x", "other")
    t.unbind_queue(V, "q", "ghost", "k")
    assert t.route(V, "x", "k") == {"q"}


def test_identical_binding_twice_needs_one_unbind() -> None:
    t = one("direct", "k")
    t.bind_queue(V, "q", "x", "k")
    t.unbind_queue(V, "q", "x", "k")
    assert t.route(V, "x", "k") == frozenset()


def test_other_exchange_type_routes_nowhere() -> None:
    t = one("x-consistent-hash", "1")
    assert t.route(V, "x", "k") == frozenset()


# --- snapshots -------------------------------------------------------------------------


def mgmt() -> dict[str, list[dict[str, object]]]:
    return {
        "exchanges": [
            {"vhost": V, "name": "", "type": "direct", "internal": False, "arguments": {}},
            {"vhost": V, "name": "x", "type": "headers", "internal": False, "arguments": {}},
            {
                "vhost": V,
                "name": "ae",
                "type": "fanout",
                "internal": True,
                "arguments": {"alternate-exchange": "nowhere"},
            },
        ],
        "queues": [{"vhost": V, "name": "q", "arguments": {}}, {"vhost": V, "name": "l"}],
        "bindings": [
            {
                "vhost": V,
                "source": "",
                "destination": "q",
                "destination_type": "queue",
                "routing_key": "q",
                "arguments": {},
            },
            {
                "vhost": V,
                "source": "x",
                "destination": "q",
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {"x-match": "all", "present": "undefined"},
            },
            {
                "vhost": V,
                "source": "ae",
                "destination": "l",
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {},
            },
        ],
        "policies": [
            {
                "vhost": V,
                "name": "p",
                "pattern": "^x$",
                "apply-to": "exchanges",
                "priority": 0,
                "definition": {"alternate-exchange": "ae"},
            }
        ],
    }


def test_from_management_reads_undefined_as_void() -> None:
    t = RoutingTable.from_management(**mgmt())
    assert t.route(V, "x", "", {"present": 42}) == {"q"}


def test_from_management_applies_policies() -> None:
    t = RoutingTable.from_management(**mgmt())
    assert t.route(V, "x", "", {}) == {"l"}


def test_from_management_keeps_internal_flag() -> None:
    assert RoutingTable.from_management(**mgmt()).is_internal(V, "ae")


def test_from_management_rejects_item_without_name() -> None:
    data = mgmt()
    data["queues"].append({"vhost": V})
    with pytest.raises(RoutingValueError):
        RoutingTable.from_management(**data)


def test_replace_swaps_in_snapshot() -> None:
    t = table("old")
    t.replace(RoutingTable.from_management(**mgmt()))
    assert (t.has_queue(V, "old"), t.has_queue(V, "q")) == (False, True)
