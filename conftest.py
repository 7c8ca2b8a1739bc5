"""Suite-wide settings: how the tests are shared out among parallel workers.

``scripts/test`` runs the suite on pytest-xdist workers (one more than the
CPUs, ``--dist loadgroup``).  Each test goes to whichever worker is free,
except the tests of one group below, which all run one after the other on
the same worker (the biggest groups are handed out first):

``spark``
    The modules whose tests use the Spark session.  The session is a JVM
    of several GiB that takes many seconds of CPU to start and gets faster
    as it runs (compiled plans are cached): one worker owns it instead of
    each starting its own.  (Two sessions on two workers were tried twice:
    on two cores they only slowed each other down.)
``spark-clusters``
    The tests that start real Spark clusters (a standalone master and
    worker, a Spark Connect server; about two minutes alone here).  They
    need no session of this process, so they run on another worker, beside
    the Spark tests.  ``RABBITFLOW_TEST_SPARK_CLUSTERS=0`` leaves them out
    (a quicker local run).
``demo``
    The demo's runs, which check that no demo queue is left on the broker.
``heavy``
    Tests that load RabbitMQ or the CPU hard (throwaway nodes, thousands of
    messages, hostile clients) or whose outcome depends on timing that a
    second such test beside them would distort: never two at once.
a module's own path
    Modules whose module-scoped fixture is a whole scenario: run once, on
    one worker, instead of once per worker.

The groups are decided here, from each test's path, by the scheduler of
:func:`pytest_xdist_make_scheduler`: pytest-xdist's own ``xdist_group``
mark is not used because with pytest 9.2 it groups nothing (the group
travels in the test's id, which pytest no longer lets a plugin change).
A test that needs the Spark session outside the Spark groups, or asks
for an ``xdist_group``, stops the run with a message saying what to add.
The Spark modules' tests are also marked ``slow``: the quick loop
(``scripts/test -m "not slow"``) leaves them out.

Without ``-n`` (plain ``pytest``) none of this changes anything.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import settings

# Properties are checked for correctness, not speed: on a loaded machine one
# example may take longer than hypothesis's default 200 ms deadline.
settings.register_profile("rabbitflow", deadline=None)
settings.load_profile("rabbitflow")

#: Modules (paths from the repository root) -> the group their tests share.
GROUPS: dict[str, str] = {
    **dict.fromkeys(
        [
            "integration/pipeline/test_analyze_gateway_log.py",
            "integration/pipeline/test_sink.py",
            "tests/pipeline/test_analyze_inputs.py",
            "tests/pipeline/test_cli.py",
            "tests/pipeline/test_episode_stats.py",
            "tests/pipeline/test_incremental.py",
            "tests/pipeline/test_inputs.py",
            "tests/pipeline/test_pairing.py",
            "tests/pipeline/test_report_browser.py",
            "tests/pipeline/test_transforms.py",
        ],
        "spark",
    ),
    # Real Spark clusters, in processes of their own: beside the Spark tests.
    "integration/pipeline/test_clusters.py": "spark-clusters",
    # Each run of the demo checks that no demo queue is left on the broker.
    **dict.fromkeys(
        ["integration/demo/test_demo.py", "integration/demo/test_compose_demo.py"], "demo"
    ),
    **dict.fromkeys(
        [
            "integration/broker/test_hostile_flow.py",
            "integration/broker/test_hostile_handshake.py",
            "integration/broker_ops/test_fd_exhaustion.py",
        ],
        "heavy",
    ),
    # Several gateway processes (and RabbitMQ nodes) each: one scenario at a time.
    **dict.fromkeys(
        [
            "integration/cluster/test_cluster_flow.py",
            "integration/cluster/test_rabbitmq_cluster.py",
            "integration/cluster/test_workers.py",
        ],
        "cluster",
    ),
    # A module-scoped scenario each (the wheel's: one build, a compile of
    # the engine; spread over two workers it was built twice).
    "integration/packaging/test_wheel.py": "integration/packaging/test_wheel.py",
    "integration/broker_ops/test_upstream_tls.py": "integration/broker_ops/test_upstream_tls.py",
    "integration/client/test_reject_publish_flow.py": (
        "integration/client/test_reject_publish_flow.py"
    ),
    "tests/pipeline/test_generate.py": "tests/pipeline/test_generate.py",
}


def group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid``, or None when it may run on any worker."""
    return GROUPS.get(nodeid.split("::", 1)[0])


#: Set to 0 to leave out the tests that start real Spark clusters.
SPARK_CLUSTERS_ENV = "RABBITFLOW_TEST_SPARK_CLUSTERS"
_SPARK_CLUSTERS = "integration/pipeline/test_clusters.py"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(SPARK_CLUSTERS_ENV) == "0":
        clusters = [item for item in items if item.nodeid.startswith(_SPARK_CLUSTERS)]
        if clusters:
            config.hook.pytest_deselected(items=clusters)
            items[:] = [item for item in items if item not in clusters]
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        spark_module = GROUPS.get(module, "").startswith("spark")
        if spark_module:
            # Together the Spark tests take minutes (and the session alone many
            # seconds to start): the quick loop, -m "not slow", leaves them out.
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is not None:
            raise pytest.UsageError(
                f"{item.nodeid}: xdist_group groups nothing with this pytest; "
                f"add {module!r} to GROUPS in conftest.py instead"
            )
        uses_spark = "spark" in getattr(item, "fixturenames", ())
        if uses_spark and GROUPS.get(module) != "spark":
            raise pytest.UsageError(
                f"{item.nodeid} uses the Spark session: add {module!r} to the "
                "Spark modules of GROUPS in conftest.py"
            )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class GroupScheduling(LoadGroupScheduling):  # type: ignore[misc]
        """``--dist loadgroup`` with the groups of :data:`GROUPS`."""

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(nodeid)
            return f"group:{group}" if group is not None else str(super()._split_scope(nodeid))

    return GroupScheduling(config, log)
