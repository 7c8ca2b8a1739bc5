"""Run ``rabbitflow-analyze`` in one driver: a batch run, then ``--incremental``.

    python -m integration.pipeline._cluster_job (--master|--remote) URL BATCH INCREMENTAL LOG...

The cluster tests run this in a process of their own: the same entry
point and arguments an operator gives ``rabbitflow-analyze``, but one
driver (one JVM, one executor on a standalone cluster) for both runs.
An empty INCREMENTAL skips the incremental run.
"""

from __future__ import annotations

import sys

from rabbitflow_pipeline.cli import main
from rabbitflow_pipeline.session import build_session


def run(argv: list[str]) -> int:
    option, url, batch, incremental, *logs = argv
    if option == "--master":
        session = build_session(url, "rabbitflow-cluster-test")
    else:
        session = build_session(remote=url)
    try:
        runs = [(batch, [])] + ([(incremental, ["--incremental"])] if incremental else [])
        for out, extra in runs:
            status = main([*logs, "--out", out, option, url, *extra], spark=session)
            if status != 0:
                return status
    finally:
        session.stop()
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
