"""Each queue's flow thresholds, and where they come from.

:class:`ThresholdBook` owns what decides a queue's thresholds: the
arguments it was declared with and the policy applied to it (from the
declares the gateway relayed and the management snapshots), the runtime
thresholds set through the admin API (kept across restarts by the service),
and the broker-wide defaults of the configuration.  It answers, for a queue,
the thresholds in force and their source, in this order:

1. ``runtime``: set through the admin API (never on a stream);
2. ``arguments``: the ``qpid.flow_*`` declare arguments;
3. ``default``: the broker's default percentages of the queue's limit
   (``x-max-length`` / ``x-max-length-bytes``, from its arguments or its
   policy, else ``--default-queue-limit``);
4. ``none``: no thresholds (:data:`~rabbitflow_broker.engine.flow.DISABLED`).

Runtime thresholds are kept as they were set: a resume value nobody set is
kept as 0 and derived from its stop value each time the thresholds are
computed, so it follows a later change of the stop value (also after a
restart and on the other members of a cluster, which get what is kept).

It holds no flow state: the hub's machines (one per queue) take their
thresholds from it, and the hub re-applies them when the book says they
may have changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rabbitflow_broker.engine.depth import QueueKey
from rabbitflow_broker.engine.flow import (
    DISABLED,
    RESUME_COUNT,
    RESUME_SIZE,
    ThresholdError,
    Thresholds,
    ThresholdsSource,
    check_value,
    default_thresholds,
    is_stream,
    thresholds_from_arguments,
    with_derived_resume,
)
from rabbitflow_broker.hub.config import GatewayConfig

__all__ = ["ThresholdBook"]

#: The admin API's threshold names -> the Thresholds fields they set.
_ADMIN_NAMES = {
    "flowStopCount": "stop_count",
    "flowResumeCount": "resume_count",
    "flowStopSize": "stop_size",
    "flowResumeSize": "resume_size",
}
#: Declare-argument names -> the admin API's (an error names what the caller sent).
_ARGUMENT_TO_ADMIN = {
    "qpid.flow_stop_count": "flowStopCount",
    "qpid.flow_resume_count": "flowResumeCount",
    "qpid.flow_stop_size": "flowStopSize",
    "qpid.flow_resume_size": "flowResumeSize",
}

_Declared = tuple[Mapping[str, object], Mapping[str, object]]  # (arguments, policy)
_NOTHING: _Declared = ({}, {})


class ThresholdBook:
    """The thresholds of every queue the gateway knows, and their sources."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._declared: dict[QueueKey, _Declared] = {}
        self._runtime: dict[QueueKey, Thresholds] = {}
        self._sources: dict[QueueKey, ThresholdsSource] = {}

    def _pct(self) -> tuple[int, int]:
        return (
            self._config.default_flow_stop_threshold,
            self._config.default_flow_resume_threshold,
        )

    # -- reading ---------------------------------------------------------------

    def validate_declare(self, arguments: Mapping[str, object] | None) -> None:
        """Check ``qpid.flow_*`` declare arguments.

        Raises:
            ThresholdError: a bad value; the message names the argument.
        """
        stop_pct, resume_pct = self._pct()
        thresholds_from_arguments(arguments, stop_pct=stop_pct, resume_pct=resume_pct)

    def compute(self, key: QueueKey) -> Thresholds:
        """The queue's thresholds as its sources say now (the source is kept
        for :meth:`source`)."""
        arguments, policy = self._declared.get(key, _NOTHING)
        stop_pct, resume_pct = self._pct()
        runtime = self._runtime.get(key)
        if runtime is not None and not is_stream(arguments):
            # A resume of 0 is not set (see set_runtime): derived here, each time.
            self._sources[key] = "runtime"
            return with_derived_resume(runtime, stop_pct=stop_pct, resume_pct=resume_pct)
        try:
            explicit = thresholds_from_arguments(
                arguments, stop_pct=stop_pct, resume_pct=resume_pct
            )
        except ThresholdError:
            explicit = None  # declared directly at RabbitMQ with bad values
        if explicit is not None:
            self._sources[key] = "arguments"
            return explicit
        default = default_thresholds(
            arguments,
            policy,
            stop_pct=stop_pct,
            resume_pct=resume_pct,
            default_queue_limit=self._config.default_queue_limit,
        )
        if default is not None:
            self._sources[key] = "default"
            return default
        self._sources[key] = "none"
        return DISABLED

    def source(self, key: QueueKey) -> ThresholdsSource:
        """Where the queue's thresholds came from when last computed."""
        return self._sources.get(key, "none")

    def declared_queues(self) -> Iterable[QueueKey]:
        """The queues declared through the gateway or listed by a snapshot."""
        return self._declared.keys()

    def knows(self, key: QueueKey) -> bool:
        """Whether the queue was declared through the gateway or listed by a snapshot."""
        return key in self._declared

    def runtime(self, key: QueueKey) -> Thresholds | None:
        """The thresholds set at run time for a queue, if any."""
        return self._runtime.get(key)

    # -- changes (the hub re-applies the thresholds where they may have changed) --

    def declared(
        self,
        key: QueueKey,
        arguments: Mapping[str, object] | None,
        policy: Mapping[str, object] | None,
    ) -> None:
        """RabbitMQ confirmed a declare: its arguments (a declare carries no
        policy; ``policy`` None or empty keeps the one known)."""
        old_policy = self._declared.get(key, _NOTHING)[1]
        self._declared[key] = (dict(arguments or {}), dict(policy or old_policy))

    def seen(
        self,
        key: QueueKey,
        arguments: Mapping[str, object] | None,
        policy: Mapping[str, object] | None,
    ) -> bool:
        """A management snapshot listed the queue: False when nothing changed."""
        new = (dict(arguments or {}), dict(policy or {}))
        if self._declared.get(key) == new:
            return False
        self._declared[key] = new
        return True

    def deleted(self, key: QueueKey) -> bool:
        """The queue is gone, and what was known of it: True when it had
        runtime thresholds (which go with it)."""
        self._declared.pop(key, None)
        self._sources.pop(key, None)
        return self._runtime.pop(key, None) is not None

    def load_runtime(self, key: QueueKey, thresholds: Thresholds | None) -> bool:
        """Install thresholds kept across restarts or set on another cluster
        member (None: forget them); whether the queue had runtime thresholds."""
        had = self._runtime.pop(key, None) is not None
        if thresholds is not None:
            self._runtime[key] = thresholds
        return had

    def _as_set(self, key: QueueKey) -> Thresholds:
        """The queue's thresholds in force, with each resume value that nobody
        set (derived from its stop value, or a default percentage) as 0."""
        now = self.compute(key)
        source = self._sources[key]
        if source == "runtime":
            return self._runtime[key]  # a derived resume is stored as 0
        arguments = self._declared.get(key, _NOTHING)[0] if source == "arguments" else {}
        return Thresholds(
            stop_count=now.stop_count,
            resume_count=now.resume_count if arguments.get(RESUME_COUNT) else 0,
            stop_size=now.stop_size,
            resume_size=now.resume_size if arguments.get(RESUME_SIZE) else 0,
        )

    def set_runtime(self, key: QueueKey, changes: Mapping[str, object]) -> Thresholds:
        """Admin-API threshold changes (camelCase keys, any subset) over the
        thresholds in force, kept as the queue's runtime thresholds; returns
        what is kept (:meth:`runtime`; :meth:`compute` gives what applies).

        A resume value is kept as 0 ("not set") unless someone set it: given
        in ``changes``, in an earlier change, or as a ``qpid.flow_resume_*``
        declare argument.  So a resume derived from its stop value (or a
        default one) follows a new stop value, as if derived again, while a
        stop value given without its resume value keeps a resume value that
        was set, as long as it still fits (else that resume is derived too).
        A stop of 0 clears its resume.

        Raises:
            ThresholdError: unknown key, bad value, or any threshold on a
                stream, naming it.
        """
        for key_name in changes:
            if key_name not in _ADMIN_NAMES:
                raise ThresholdError(key_name, "unknown threshold")
        if is_stream(self._declared.get(key, _NOTHING)[0]):
            raise ThresholdError(
                next(iter(changes), "flowStopCount"),
                f"queue {key[1]!r} is a stream: flow thresholds do not apply to streams "
                "(consuming removes nothing from a stream, so its producers could never resume)",
            )
        now = self._as_set(key)
        values = {
            "stop_count": now.stop_count,
            "resume_count": now.resume_count,
            "stop_size": now.stop_size,
            "resume_size": now.resume_size,
        }
        for key_name, attribute in _ADMIN_NAMES.items():
            if key_name in changes:
                values[attribute] = check_value(key_name, changes[key_name])
        for stop_field, resume_field, resume_key in (
            ("stop_count", "resume_count", "flowResumeCount"),
            ("stop_size", "resume_size", "flowResumeSize"),
        ):
            if resume_key not in changes and values[resume_field] > values[stop_field]:
                values[resume_field] = 0  # a kept resume that no longer fits: derived
        try:
            thresholds = Thresholds(**values)
        except ThresholdError as exc:
            raise ThresholdError(
                _ARGUMENT_TO_ADMIN.get(exc.argument, exc.argument), exc.reason
            ) from None
        self._runtime[key] = thresholds
        return thresholds
