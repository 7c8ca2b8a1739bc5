"""Fixtures for the pipeline integration tests: the one Spark session and the gateway."""

from __future__ import annotations

from integration.broker.conftest import gateway_factory
from tests.pipeline.conftest import pytest_configure, spark

__all__ = ["gateway_factory", "pytest_configure", "spark"]
