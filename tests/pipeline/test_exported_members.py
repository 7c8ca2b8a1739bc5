"""The package's public surface is pinned."""

from __future__ import annotations

import rabbitflow_pipeline


def test_public_names() -> None:
    assert rabbitflow_pipeline.__all__ == ["SinkError", "publish_dataframe"]
