"""rabbitflow_pipeline: PySpark analytics over rabbitflow flow-control events, and a
flow-controlled DataFrame sink.

``rabbitflow-analyze`` (:func:`rabbitflow_pipeline.cli.main`) is the job;
its plan of steps is :mod:`rabbitflow_pipeline.plan` (one module per table
each step builds), the schemas are in :mod:`rabbitflow_pipeline.schemas`.
"""

from rabbitflow_pipeline.sink import SinkError, publish_dataframe

__all__ = ["SinkError", "publish_dataframe"]
