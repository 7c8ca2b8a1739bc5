"""rabbitflow_pipeline: PySpark analytics over rabbitflow flow-control events, and a
flow-controlled DataFrame sink.

``rabbitflow-analyze`` (:func:`rabbitflow_pipeline.cli.main`) is the job;
the transforms live in :mod:`rabbitflow_pipeline.transforms`, the schemas in
:mod:`rabbitflow_pipeline.schemas`.
"""

from rabbitflow_pipeline.sink import SinkError, publish_dataframe

__all__ = ["SinkError", "publish_dataframe"]
