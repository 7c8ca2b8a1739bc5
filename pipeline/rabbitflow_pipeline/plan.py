"""The analysis as a plan of named steps, each building one table from the tables it reads.

::

    event_records ─ events ─(pairing)─ intervals ─┬─ episodes ─── queue_stats ─┬─ queue_summary
    (the lines read)                               ├─ channel_blocks ─ blocked_channels ┘
                                                   ├─ store_episodes
    client_lines ─ parsed_client ─ client_records ─ send_delays ─┐
                                   queue_stats, queue_limits ───┴─ advice_rules ─ advice
    intervals, parsed_client ─ malformed

The batch job (:func:`rabbitflow_pipeline.batch.analyze`) and the incremental
step (:func:`rabbitflow_pipeline.incremental.run_step`) both run these
steps; they differ in how they read the input, pair it and store the
tables (the incremental step gives the tables it keeps across steps, so
their steps are not run again).  A :class:`Run` runs steps in the order
given, each once the tables it reads are built, and does with each table
what the job asks (:class:`Output`: keep its rows, write it, observe
metrics while writing it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation

from rabbitflow_pipeline.advice import advice_rules
from rabbitflow_pipeline.advice_text import advice_table
from rabbitflow_pipeline.blocks import blocked_channels, channel_blocks_from
from rabbitflow_pipeline.delays import send_delays
from rabbitflow_pipeline.episodes import episodes_from, queue_episode_stats
from rabbitflow_pipeline.inputs import classify_events, client_flow_records, parse_client_lines
from rabbitflow_pipeline.malformed import malformed_from
from rabbitflow_pipeline.outputs import Kept, write_table
from rabbitflow_pipeline.store import store_episodes_from
from rabbitflow_pipeline.summary import queue_summary_of_channels

__all__ = [
    "AGGREGATE_STEPS",
    "INTERVAL_STEPS",
    "PARSE_STEPS",
    "PLAN",
    "Output",
    "Run",
    "Step",
]

#: A table as a run holds it: built, being built, or absent (no queue limits).
Table = DataFrame | Future[DataFrame] | None


@dataclass(frozen=True)
class Step:
    """One step of the plan: the table it builds, the tables it reads, and how."""

    builds: str
    reads: tuple[str, ...]
    build: Callable[..., DataFrame]

    def __call__(self, tables: Mapping[str, DataFrame | None]) -> DataFrame:
        """The table built from ``tables`` (which hold at least :attr:`reads`)."""
        return self.build(*(tables[name] for name in self.reads))


PARSE_EVENTS = Step("events", ("event_records",), classify_events)
PARSE_CLIENT = Step("parsed_client", ("client_lines",), parse_client_lines)
EPISODES = Step("episodes", ("intervals",), episodes_from)
CHANNEL_BLOCKS = Step("channel_blocks", ("intervals",), channel_blocks_from)
STORE_EPISODES = Step("store_episodes", ("intervals",), store_episodes_from)
QUEUE_STATS = Step("queue_stats", ("episodes", "window"), queue_episode_stats)
CLIENT_RECORDS = Step("client_records", ("parsed_client",), client_flow_records)
SEND_DELAYS = Step("send_delays", ("client_records",), send_delays)
MALFORMED = Step("malformed", ("intervals", "parsed_client"), malformed_from)
BLOCKED_CHANNELS = Step("blocked_channels", ("channel_blocks",), blocked_channels)
QUEUE_SUMMARY = Step(
    "queue_summary", ("queue_stats", "blocked_channels", "window"), queue_summary_of_channels
)
ADVICE_RULES = Step("advice_rules", ("queue_stats", "send_delays", "queue_limits"), advice_rules)
ADVICE = Step("advice", ("advice_rules",), advice_table)

#: Reading: the event records and client lines parsed (before the pairing).
PARSE_STEPS = (PARSE_EVENTS, PARSE_CLIENT)
#: The tables of the paired intervals.
INTERVAL_STEPS = (EPISODES, CHANNEL_BLOCKS, STORE_EPISODES)
#: The tables aggregated from those and from the client records.
AGGREGATE_STEPS = (
    QUEUE_STATS,
    CLIENT_RECORDS,
    SEND_DELAYS,
    MALFORMED,
    BLOCKED_CHANNELS,
    QUEUE_SUMMARY,
    ADVICE_RULES,
    ADVICE,
)
#: The whole plan, in order (the pairing, each job's own, comes between
#: :data:`PARSE_STEPS` and :data:`INTERVAL_STEPS`).
PLAN = (*PARSE_STEPS, *INTERVAL_STEPS, *AGGREGATE_STEPS)


@dataclass(frozen=True)
class Output:
    """What a run does with a step's table besides building it."""

    #: Compute it once and keep its rows (the steps after read those).
    keep: bool = False
    #: Write it under the run's directory, as a table of the step's name.
    write: bool = False
    #: An observation and its metrics, observed while the table is kept or written.
    observe: tuple[Observation, Sequence[Column]] | None = None


class Run:
    """Steps run over named tables, Spark jobs submitted to ``pool``.

    A step is built on the calling thread, in the order given, once the
    tables it reads are there (waiting for a table being kept); its
    Spark jobs (keeping, writing) go to ``pool``, so independent ones
    overlap.  Each job is exactly the one it would be in sequence.
    """

    def __init__(
        self, pool: Executor, kept: Kept, out: Path | None, tables: Mapping[str, Table]
    ) -> None:
        self._pool = pool
        self._kept = kept
        self._out = out
        self._tables: dict[str, Table] = dict(tables)
        self._jobs: list[Future[None]] = []

    def give(self, name: str, table: Table) -> None:
        """Add a table built elsewhere (its step is then not run)."""
        self._tables[name] = table

    def keep(self, df: DataFrame) -> Future[DataFrame]:
        """Keep ``df``'s rows, in a job of the pool (a table of the job's own)."""
        return self._pool.submit(self._kept.keep, df)

    def table(self, name: str) -> DataFrame:
        """Table ``name`` (waiting while it is being kept).

        Raises:
            KeyError: no step built it and it was not given.
        """
        table = self._optional(name)
        if table is None:
            raise KeyError(name)
        return table

    def _optional(self, name: str) -> DataFrame | None:
        table = self._tables[name]
        return table.result() if isinstance(table, Future) else table

    def run(self, steps: Iterable[Step], outputs: Mapping[str, Output]) -> None:
        """Build each of ``steps`` whose table was not given, with its output in ``outputs``."""
        for step in steps:
            if step.builds in self._tables:
                continue
            built = step({name: self._optional(name) for name in step.reads})
            self._tables[step.builds] = self._output(step.builds, built, outputs.get(step.builds))

    def _output(self, name: str, df: DataFrame, output: Output | None) -> Table:
        if output is None:
            return df
        observed = df
        if output.observe is not None:
            observation, metrics = output.observe
            observed = df.observe(observation, *metrics)
        if output.keep:
            return self._pool.submit(self._keep, name, observed, output.write)
        if output.write:
            # The steps after read the table as it is built, not its observed twin.
            self._jobs.append(self._pool.submit(self._write, observed, name))
            return df
        # Observed by the first job that reads it.
        return observed

    def _keep(self, name: str, df: DataFrame, write: bool) -> DataFrame:
        kept = self._kept.keep(df)
        if write:
            self._write(kept, name)
        return kept

    def _write(self, df: DataFrame, name: str) -> None:
        assert self._out is not None
        write_table(df, self._out / name)

    def finish(self) -> dict[str, DataFrame]:
        """Wait for every job; returns the tables (kept ones as kept).

        Raises:
            Exception: what a job raised.
        """
        for job in self._jobs:
            job.result()
        built = {name: self._optional(name) for name in self._tables}
        return {name: df for name, df in built.items() if df is not None}
