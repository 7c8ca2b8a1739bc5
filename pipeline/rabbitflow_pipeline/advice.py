"""The threshold advice, as data: per queue with flow episodes, which rule applies and its figures.

Two checks per queue, each a list of rules tried in order (the first whose
condition holds applies):

* **stop**: with producers of capacities c1..cn honouring flow control the
  depth can reach ``stop_count + c1 + … + cn``, which must fit under the
  queue's maximum (``max_count``).  Capacities are the largest each
  producer reported for ``queue://<name>`` (the ``send_delays`` table);
  when no client log covers the queue, or the maximum is unknown, the rule
  says so and advises with what is known.
* **resume**: producers stay blocked while the queue drains from its stop
  to its resume threshold.  The median drain rate of closed episodes gives
  the resume count that would keep a block near ``target_block_s`` (the
  SDK's default notify period: longer blocks log "send delayed").

:func:`advice_rules` gives one row per queue: the rule ids (``stop_rule``,
``resume_rule``), the figures they are judged on and the suggested values.
What a rule says in words is the report layer's
(:mod:`rabbitflow_pipeline.advice_text`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

__all__ = [
    "ADVICE_COLUMNS",
    "FIGURE_COLUMNS",
    "RESUME_RULES",
    "STOP_RULES",
    "Rule",
    "advice_rules",
]

#: The columns of the ``advice`` table, in order; ``stop_advice`` and
#: ``resume_advice`` are the rules' words (:mod:`rabbitflow_pipeline.advice_text`).
ADVICE_COLUMNS = (
    "vhost",
    "queue",
    "episodes",
    "stop_count",
    "resume_count",
    "stop_size",
    "resume_size",
    "max_count",
    "max_size",
    "producers",
    "capacity_sum",
    "worst_case_depth",
    "stop_ok",
    "suggested_stop_count",
    "stop_advice",
    "drain_rate_msgs_s",
    "blocked_p50_s",
    "suggested_resume_count",
    "resume_advice",
    "stop_rule",
    "resume_rule",
)

#: Figures :func:`advice_rules` adds for the rules' words only (not in the table).
FIGURE_COLUMNS = ("destination", "stop_size_shown", "stop_excess", "stop_room", "target_block_s")


@dataclass(frozen=True)
class Rule:
    """One advice rule: its id and the condition (on :func:`advice_rules`' columns) it needs.

    Rules of one check are tried in order; the first whose condition holds
    applies, the last one's condition is ``None`` (always).
    """

    id: str
    when: str | None


# Conditions as Spark SQL over the figures.  ``has_stop``: a positive
# message-count stop threshold; ``known``: capacities and maximum both known.
_HAS_STOP = "(stop_count IS NOT NULL AND stop_count > 0)"
_KNOWN = "(capacity_sum IS NOT NULL AND max_count IS NOT NULL)"

#: The stop threshold's rules, in order.
STOP_RULES = (
    Rule("stop.no_count_threshold", f"NOT {_HAS_STOP} AND max_size IS NULL"),
    Rule("stop.no_count_threshold_max_size", f"NOT {_HAS_STOP}"),
    Rule("stop.ok", f"{_KNOWN} AND stop_count + capacity_sum <= max_count"),
    Rule("stop.lower", f"{_KNOWN} AND max_count - capacity_sum > 0"),
    Rule("stop.reduce_capacities", _KNOWN),
    Rule("stop.max_unknown", "capacity_sum IS NOT NULL"),
    Rule("stop.capacities_unknown", "max_count IS NOT NULL"),
    Rule("stop.both_unknown", None),
)

#: The resume threshold's rules, in order.
RESUME_RULES = (
    Rule(
        "resume.no_count_threshold",
        f"NOT ({_HAS_STOP} AND resume_count IS NOT NULL AND resume_count > 0)",
    ),
    Rule("resume.drain_unknown", "drain_rate_msgs_s IS NULL OR blocked_p50_s IS NULL"),
    Rule("resume.raise", "suggested_resume_count IS NOT NULL"),
    Rule("resume.ok", None),
)


def _first_rule(rules: tuple[Rule, ...]) -> Column:
    """The id of the first rule of ``rules`` whose condition holds."""
    chosen: Column | None = None
    for rule in rules:
        if rule.when is None:
            assert chosen is not None
            return chosen.otherwise(F.lit(rule.id))
        condition = F.coalesce(F.expr(rule.when), F.lit(False))
        chosen = (
            F.when(condition, F.lit(rule.id))
            if chosen is None
            else chosen.when(condition, F.lit(rule.id))
        )
    raise ValueError("the last rule must have no condition")


def _per_queue(stats: DataFrame, delays: DataFrame | None, limits: DataFrame | None) -> DataFrame:
    """Each queue's thresholds and episode figures, its producers' capacities and its maxima."""
    per_queue = stats.select(
        "vhost",
        "queue",
        "stop_count",
        "stop_size",
        "resume_count",
        "resume_size",
        F.col("flow_stopped_count").alias("episodes"),
        "drain_rate_msgs_s",
        F.col("duration_p50_s").alias("blocked_p50_s"),
    )
    per_queue = per_queue.withColumn("destination", F.concat(F.lit("queue://"), F.col("queue")))
    if delays is not None:
        capacities = (
            delays.where(F.col("capacity").isNotNull() & F.col("destination").isNotNull())
            .groupBy("destination")
            .agg(F.count(F.lit(1)).alias("producers"), F.sum("capacity").alias("capacity_sum"))
        )
        per_queue = per_queue.join(capacities, "destination", "left")
    else:
        per_queue = per_queue.withColumn("producers", F.lit(None).cast("long")).withColumn(
            "capacity_sum", F.lit(None).cast("long")
        )
    if limits is not None:
        return per_queue.join(
            limits.select("vhost", "queue", "max_count", "max_size"), ["vhost", "queue"], "left"
        )
    return per_queue.withColumn("max_count", F.lit(None).cast("long")).withColumn(
        "max_size", F.lit(None).cast("long")
    )


def advice_rules(
    stats: DataFrame,
    delays: DataFrame | None,
    limits: DataFrame | None,
    *,
    target_block_s: float = 5.0,
) -> DataFrame:
    """Per (vhost, queue) of ``stats`` (:func:`~rabbitflow_pipeline.episodes.queue_episode_stats`):
    the rule of each check that applies, and its figures.

    ``delays`` is the ``send_delays`` table (its ``capacity`` per producer
    and destination), or ``None`` when no client log was read; ``limits``
    the queue maxima (``vhost``, ``queue``, ``max_count``, ``max_size``),
    or ``None``.  Columns: those of :data:`ADVICE_COLUMNS` but the words,
    and :data:`FIGURE_COLUMNS`.

    Raises:
        ValueError: ``target_block_s`` is not positive.
    """
    if not target_block_s > 0 or math.isinf(target_block_s):
        raise ValueError(f"target_block_s must be a positive number, got {target_block_s}")
    per_queue = _per_queue(stats, delays, limits)
    stop, cap, mx = F.col("stop_count"), F.col("capacity_sum"), F.col("max_count")
    worst = stop + cap
    has_stop = stop.isNotNull() & (stop > 0)
    rate, resume, p50 = F.col("drain_rate_msgs_s"), F.col("resume_count"), F.col("blocked_p50_s")
    count_mode = has_stop & resume.isNotNull() & (resume > 0)
    too_long = count_mode & rate.isNotNull() & (rate > 0) & (p50 > F.lit(float(target_block_s)))
    capped = F.least(
        F.greatest(resume, stop - F.ceil(rate * F.lit(float(target_block_s)))), stop - 1
    )
    figures = per_queue.select(
        *per_queue.columns,
        F.when(has_stop & cap.isNotNull(), worst).alias("worst_case_depth"),
        F.when(has_stop & cap.isNotNull() & mx.isNotNull(), worst <= mx).alias("stop_ok"),
        F.when(has_stop & cap.isNotNull() & mx.isNotNull() & (worst > mx), mx - cap).alias(
            "suggested_stop_count"
        ),
        F.when(too_long & (capped > resume), capped).alias("suggested_resume_count"),
        F.coalesce(F.col("stop_size"), F.lit(0)).alias("stop_size_shown"),
        (worst - mx).alias("stop_excess"),
        (mx - stop).alias("stop_room"),
        F.lit(float(target_block_s)).alias("target_block_s"),
    )
    return figures.select(
        *(
            c
            for c in ADVICE_COLUMNS
            if c not in ("stop_advice", "resume_advice", "stop_rule", "resume_rule")
        ),
        _first_rule(STOP_RULES).alias("stop_rule"),
        _first_rule(RESUME_RULES).alias("resume_rule"),
        *FIGURE_COLUMNS,
    )
