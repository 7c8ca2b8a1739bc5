"""Property tests: RoutingTable against small reference implementations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rabbitflow_broker.engine.routing import RoutingTable

V = "/"
words = st.sampled_from(["a", "b", ""])
pattern_words = st.sampled_from(["a", "b", "", "*", "#"])
keys = st.lists(words, max_size=5).map(".".join)
patterns = st.lists(pattern_words, max_size=5).map(".".join)


def reference_topic(pattern: list[str], key: list[str]) -> bool:
    """AMQP topic semantics written directly: # eats zero or more words."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_topic(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head in ("*", key[0])) and reference_topic(rest, key[1:])


def split(key: str) -> list[str]:
    return key.split(".") if key else []


@settings(max_examples=400, deadline=None)
@given(st.lists(patterns, min_size=1, max_size=6), keys)
def test_topic_routing_matches_reference(bound: list[str], key: str) -> None:
    t = RoutingTable()
    t.declare_exchange(V, "x", "topic")
    for i, pattern in enumerate(bound):
        t.declare_queue(V, f"q{i}")
        t.bind_queue(V, f"q{i}", "x", pattern)
    expected = {f"q{i}" for i, p in enumerate(bound) if reference_topic(split(p), split(key))}
    assert t.route(V, "x", key) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(patterns, min_size=1, max_size=6), st.data())
def test_topic_unbinding_restores_routing(bound: list[str], data: st.DataObject) -> None:
    t = RoutingTable()
    t.declare_exchange(V, "x", "topic")
    t.declare_queue(V, "q")
    for pattern in bound:
        t.bind_queue(V, "q", "x", pattern)
    removed = data.draw(st.sampled_from(bound))
    t.unbind_queue(V, "q", "x", removed)
    key = data.draw(keys)
    remaining = set(bound) - {removed}
    expected = {"q"} if any(reference_topic(split(p), split(key)) for p in remaining) else set()
    assert t.route(V, "x", key) == expected


header_keys = st.sampled_from(["a", "b", "x-c"])
header_values = st.one_of(st.none(), st.sampled_from(["v", "w"]), st.integers(0, 2), st.booleans())


def reference_headers(args: dict[str, object], headers: dict[str, object]) -> bool:
    mode = args.get("x-match", "all")
    with_x = str(mode).endswith("-with-x")
    tests = [
        (k, v) for k, v in args.items() if k != "x-match" and (with_x or not k.startswith("x-"))
    ]

    def ok(k: str, v: object) -> bool:
        if k not in headers:
            return False
        got = headers[k]
        return v is None or ((type(got) is bool) == (type(v) is bool) and got == v)

    if str(mode).startswith("all"):
        return all(ok(k, v) for k, v in tests)
    return any(ok(k, v) for k, v in tests)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(header_keys, header_values),
    st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"]),
    st.dictionaries(header_keys, header_values),
)
def test_headers_routing_matches_reference(
    binding: dict[str, object], mode: str | None, headers: dict[str, object]
) -> None:
    args = dict(binding) if mode is None else {**binding, "x-match": mode}
    t = RoutingTable()
    t.declare_exchange(V, "x", "headers")
    t.declare_queue(V, "q")
    t.bind_queue(V, "q", "x", "", args)
    assert (t.route(V, "x", "", headers) == {"q"}) == reference_headers(args, headers)
