"""The cluster's control messages: JSON objects, ``t`` is the type.

========  ===================  =================================================
``t``     to                   what
========  ===================  =================================================
hello     owner queue, all     a member's heartbeat and description
req       owner                allowance request (``a``: asked at), with reports
rep       owner                reports only
grant     the member           a grant
free      the member           the queue has no thresholds: no allowance needed
state     all                  owner, epoch, ON queues, administrator stops, depths
depth     all                  the owner's depths of the queues in use (each round)
stops     all                  administrator stops changed on a member
thr       all                  runtime thresholds set on a member (or gone with
                               their queue: ``th`` null), with their stamp
epoch     the epochs queue     the last epoch an owner took, in place of the one
                               before (read by a member handed the owner queue)
========  ===================  =================================================

A reader takes what it needs and raises ``KeyError``, ``TypeError`` or
``ValueError`` on a malformed message (the node logs and ignores it).
"""

from __future__ import annotations

import math
from typing import Any

from rabbitflow_broker.engine.cluster import Grant, Request
from rabbitflow_broker.engine.cluster_book import QueueKey
from rabbitflow_broker.engine.cluster_settings import thresholds_list, thresholds_of
from rabbitflow_broker.engine.flow import Thresholds

__all__ = [
    "grant_message",
    "queue_key",
    "queue_name",
    "read_grant",
    "read_thresholds",
    "request_message",
    "thresholds_message",
]

Message = dict[str, Any]


def queue_name(key: QueueKey) -> str:
    """The books' name of a queue: vhost and name, NUL between."""
    return f"{key[0]}\x00{key[1]}"


def queue_key(name: str) -> QueueKey:
    vhost, _, queue = name.partition("\x00")
    return vhost, queue


def _key_of(message: Message) -> QueueKey:
    return str(message["v"]), str(message["q"])


def request_message(member: str, request: Request) -> Message:
    """``req`` (allowance asked for), or ``rep`` (reports only: ``asked_at`` NaN)."""
    vhost, queue = queue_key(request.queue)
    asking = not math.isnan(request.asked_at)
    return {
        "t": "req" if asking else "rep",
        "m": member,
        "v": vhost,
        "q": queue,
        "a": request.asked_at if asking else None,
        "r": [
            [r.grant_id, r.used, r.removed, r.returned, r.used_bytes, r.removed_bytes]
            for r in request.reports
        ],
    }


def grant_message(key: QueueKey, grant: Grant) -> Message:
    return {
        "t": "grant",
        "v": key[0],
        "q": key[1],
        "g": grant.grant_id,
        "n": grant.amount,
        "a": grant.asked_at,
        "e": grant.epoch,
    }


def read_grant(member: str, message: Message) -> tuple[QueueKey, Grant]:
    key = _key_of(message)
    grant = Grant(
        member,
        queue_name(key),
        int(message["g"]),
        int(message["n"]),
        float(message["a"]),
        int(message["e"]),
    )
    return key, grant


def thresholds_message(
    member: str, key: QueueKey, thresholds: Thresholds | None, stamps: list[list[Any]]
) -> Message:
    """``thr``: a queue's runtime thresholds (None: gone with the queue) and
    their stamp (:meth:`~rabbitflow_broker.engine.cluster_settings.SharedThresholds.wire`)."""
    return {
        "t": "thr",
        "m": member,
        "v": key[0],
        "q": key[1],
        "th": thresholds_list(thresholds),
        "tv": stamps,
    }


def read_thresholds(message: Message) -> tuple[QueueKey, Thresholds]:
    """The thresholds of a ``thr`` from a member without stamps."""
    thresholds = thresholds_of(message["th"])
    if thresholds is None:
        raise ValueError("a thr without stamps names no thresholds")
    return _key_of(message), thresholds
