"""The brokers a connection may use, and the order it tries them in (pure).

A ``ConnectionFactory`` takes one URL, several (a list, or one string with
commas), or Qpid JMS's failover form::

    amqp://a:5673
    ["amqp://a:5673", "amqp://b:5673"]
    "amqp://a:5673,amqp://b:5673"
    "failover:(amqp://a:5673,amqp://b:5673)"

``parse_urls`` turns any of them into a tuple of URLs, checking each, and
``Endpoints`` hands them out round robin: connecting starts at the first,
and each recovery attempt takes the next one after the URL last tried.  Both
the sync and the asyncio drivers use this module.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from urllib.parse import urlsplit

from ._exceptions import ConnectionLostError, InvalidPropertyError, JMSException

__all__ = ["Endpoints", "all_failed", "parse_urls", "redact"]

_SCHEMES = ("amqp", "amqps")
_FAILOVER = "failover:"


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for logs and errors)."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at:
        return url
    user = creds.split(":", 1)[0]
    return f"{scheme}{sep}{user}:***@{host}"


def _split(text: str) -> list[str]:
    stripped = text.strip()
    if stripped[: len(_FAILOVER)].lower() != _FAILOVER:
        return [part.strip() for part in stripped.split(",")]
    inner = stripped[len(_FAILOVER) :].strip()
    if not (inner.startswith("(") and ")" in inner):
        raise InvalidPropertyError(
            "url", f"a failover URL is failover:(url,url,...), got {redact(text)!r}"
        )
    close = inner.rindex(")")
    if inner[close + 1 :].strip():
        raise InvalidPropertyError(
            "url",
            f"failover options are not supported (use the rabbitflow.reconnect_* "
            f"properties): {redact(inner[close + 1 :].strip())!r}",
        )
    return [part.strip() for part in inner[1:close].split(",")]


def _check(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme.lower() not in _SCHEMES:
        raise InvalidPropertyError(
            "url", f"expected an amqp:// or amqps:// URL, got {redact(url)!r}"
        )
    if not parts.hostname:
        raise InvalidPropertyError("url", f"no host in {redact(url)!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError as exc:
        raise InvalidPropertyError("url", f"bad port in {redact(url)!r}: {exc}") from None
    return url


def parse_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """The URLs in ``urls``, in order: one URL, several separated by commas,
    ``failover:(url,url,...)``, or a list of URLs.

    Every URL of a list must use the same scheme: a failover from
    ``amqps://`` to ``amqp://`` would send the credentials in clear.

    Raises:
        InvalidPropertyError: no URL, an empty item, a malformed failover
            form, a URL that is not amqp:// or amqps:// or has no host, or
            mixed schemes (also a ValueError; the text names the item), or
            ``urls`` is neither a string nor a list of strings.
    """
    if isinstance(urls, str):
        items = _split(urls)
    elif isinstance(urls, Sequence) and all(isinstance(u, str) for u in urls):
        items = [u.strip() for u in urls]
    else:
        raise InvalidPropertyError(
            "url", f"expected a string or a list of strings, got {type(urls).__name__}"
        )
    if not items or items == [""]:
        raise InvalidPropertyError("url", "no broker URL given")
    if any(not item for item in items):
        raise InvalidPropertyError("url", f"an empty item in {[redact(i) for i in items]!r}")
    checked = tuple(_check(item) for item in items)
    schemes = {urlsplit(u).scheme.lower() for u in checked}
    if len(schemes) > 1:
        raise InvalidPropertyError(
            "url", "mixes amqp:// and amqps:// URLs: a failover would drop TLS"
        )
    return checked


class Endpoints:
    """Round-robin rotation over a connection's URLs.

    ``next()`` returns the URL to try now and moves on; ``current`` is the
    last URL handed out (the one the connection uses once it succeeded).
    """

    def __init__(self, urls: Sequence[str]) -> None:
        if not urls:
            raise InvalidPropertyError("url", "no broker URL given")
        self.urls = tuple(urls)
        self._next = 0
        self.current = self.urls[0]

    def __len__(self) -> int:
        return len(self.urls)

    def next(self) -> str:
        """The URL to try now; the following call returns the one after it."""
        url = self.urls[self._next]
        self._next = (self._next + 1) % len(self.urls)
        self.current = url
        return url

    def one_round(self) -> Iterator[str]:
        """Every URL once, from the next one on (the initial connect); lazy,
        so ``current`` is the URL being tried."""
        for _ in self.urls:
            yield self.next()


def all_failed(errors: list[tuple[str, JMSException]]) -> JMSException:
    """The error to raise when every URL of an initial connect failed."""
    if len(errors) == 1:
        return errors[0][1]
    for _url, error in errors:
        if not isinstance(error, ConnectionLostError):
            return error
    text = "; ".join(f"{redact(url)}: {error}" for url, error in errors)
    lost = ConnectionLostError(f"none of {len(errors)} broker URLs could be reached: {text}")
    lost.__cause__ = errors[-1][1]
    return lost
