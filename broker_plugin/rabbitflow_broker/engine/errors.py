"""The broker's one exception tree, by what the caller can do about it::

    BrokerError
    ├── UsageError                  fix the input: an option, a threshold, a route
    │   ├── ConfigError (ValueError)            config: a bad option value
    │   ├── ThresholdError (ValueError)         flow: a refused threshold
    │   └── RoutingError                        routing_match: what RabbitMQ would refuse
    │       ├── RoutingNotFoundError (LookupError)
    │       └── RoutingValueError (ValueError)
    ├── ProtocolError               a peer broke AMQP 0-9-1: close its connection
    │   ├── FrameError                          carries the AMQP reply code
    │   └── TransitionError                     engine_state: an illegal lifecycle move
    ├── StateError (RuntimeError)   a machine was driven out of order: a bug
    │   ├── IllegalTransition                   flow: the threshold machine
    │   └── StoreTransitionError                store: the store-quota machine
    └── OutsideError                something outside the gateway failed: retry or report
        ├── PersistenceError                    persistence: thresholds not loaded or saved
        ├── ManagementError                     upstream: the management API failed
        ├── DeclareError                        depth_poller: a passive declare failed
        ├── BusError                            cluster_bus: the cluster's control connection
        └── NodeError (RuntimeError)            rabbitmq_node: a throwaway node

Each class stays importable from the module named beside it; this module
holds the root and the branches (and the errors of the pure engine).
"""

from __future__ import annotations

__all__ = [
    "BrokerError",
    "FrameError",
    "OutsideError",
    "ProtocolError",
    "StateError",
    "TransitionError",
    "UsageError",
]


class BrokerError(Exception):
    """The root of every error the broker package raises on purpose."""


class UsageError(BrokerError):
    """The caller passed something invalid: an option, a threshold, a route."""


class ProtocolError(BrokerError):
    """A peer broke AMQP 0-9-1; its connection is closed."""


class StateError(BrokerError, RuntimeError):
    """A state machine was driven out of order: a bug in the caller."""


class OutsideError(BrokerError):
    """Something outside the gateway failed (a store, a node): retry or report."""


class FrameError(ProtocolError):
    """A protocol violation; ``code`` is the AMQP reply code to close with
    (importable from :mod:`~rabbitflow_broker.engine.frames` too)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text


class TransitionError(ProtocolError):
    """A connection's lifecycle was asked for a move its table does not hold
    (see :mod:`~rabbitflow_broker.engine.state`); names the state and the event."""

    def __init__(self, state: str, event: str) -> None:
        super().__init__(f"no move from {state} on {event}")
        self.state = state
        self.event = event
