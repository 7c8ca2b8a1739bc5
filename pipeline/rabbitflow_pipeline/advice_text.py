"""The threshold advice in words: a template per advice rule, filled with the rule's figures.

The rules and their figures are data (:mod:`rabbitflow_pipeline.advice`);
this is the one place that words them.  A template names the figures it
shows in braces, with how to show each:

* ``{name}``: a whole number with thousands separators (``1,200``);
* ``{name:.1f}`` (any ``.Nf``): a number with N decimals;
* ``{name:s}``: the value as text (a null shows as ``null``);
* ``{name:text}``: a text column as it is.

:func:`advice_table` puts the words (``stop_advice``, ``resume_advice``)
into the ``advice`` table as it is written; ``report.html`` shows them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rabbitflow_pipeline.advice import ADVICE_COLUMNS, RESUME_RULES, STOP_RULES

__all__ = ["TEMPLATES", "advice_table", "render"]

_CAPACITIES = "producer capacities {capacity_sum} ({producers:s} producers in client logs)"
_NO_CLIENT_LOG = "producer capacities unknown (no client log for {destination:text})"
_NO_COUNT_STOP = (
    "no message-count stop threshold (stop size {stop_size_shown} bytes); "
    "producer capacities bound messages, not bytes"
)
_DRAIN = (
    "producers blocked p50 {blocked_p50_s:.1f}s while the queue drained from stop "
    "{stop_count} to resume {resume_count} at {drain_rate_msgs_s:.1f} msg/s"
)

#: Rule id -> its words (see :data:`rabbitflow_pipeline.advice.STOP_RULES`, ``RESUME_RULES``).
TEMPLATES: Mapping[str, str] = {
    "stop.no_count_threshold": _NO_COUNT_STOP,
    "stop.no_count_threshold_max_size": _NO_COUNT_STOP + "; queue maximum {max_size} bytes",
    "stop.ok": (
        "OK: stop {stop_count} + " + _CAPACITIES + " = {worst_case_depth} <= queue maximum "
        "{max_count}"
    ),
    "stop.lower": (
        "LOWER STOP: stop {stop_count} + " + _CAPACITIES + " = {worst_case_depth} exceeds "
        "queue maximum {max_count} by {stop_excess}; set qpid.flow_stop_count <= "
        "{suggested_stop_count}"
    ),
    "stop.reduce_capacities": (
        "REDUCE CAPACITIES: " + _CAPACITIES + " alone reach queue maximum {max_count}; "
        "lower producer capacities or raise the maximum"
    ),
    "stop.max_unknown": (
        "queue maximum unknown (pass --queue-limits): depth can reach stop {stop_count} + "
        + _CAPACITIES
        + " = {worst_case_depth}; the maximum must be at least that"
    ),
    "stop.capacities_unknown": (
        _NO_CLIENT_LOG + ": stop {stop_count} leaves {stop_room} messages under queue maximum "
        "{max_count}; the producers' capacities must sum to at most that"
    ),
    "stop.both_unknown": (
        _NO_CLIENT_LOG + " and queue maximum unknown: depth can reach stop {stop_count} + "
        "the sum of producer capacities"
    ),
    "resume.no_count_threshold": "no message-count resume threshold: no count-based advice",
    "resume.drain_unknown": "no closed episode with a measurable drain: drain time unknown",
    "resume.raise": (
        "RAISE RESUME: " + _DRAIN + "; resume at {suggested_resume_count} to keep blocks near "
        "{target_block_s:.0f}s (at the cost of more frequent stops)"
    ),
    "resume.ok": "OK: " + _DRAIN,
}

_FIELD = re.compile(r"\{(\w+)(?::([^}]*))?\}")


def _shown(name: str, how: str | None) -> Column:
    column = F.col(name)
    if how is None:
        return F.format_number(column, 0)
    if how == "text":
        return column
    if how == "s" or re.fullmatch(r"\.\d+f", how):
        return F.format_string(f"%{how}", column)
    raise ValueError(f"unknown way to show {{{name}:{how}}}")


def render(template: str) -> Column:
    """``template`` as a column: its text with each ``{figure}`` filled in from the row.

    Null when a whole-number or text figure it shows is null.

    Raises:
        ValueError: a ``{name:how}`` with a ``how`` not listed in the module docstring.
    """
    parts: list[Column] = []
    end = 0
    for field in _FIELD.finditer(template):
        if field.start() > end:
            parts.append(F.lit(template[end : field.start()]))
        parts.append(_shown(field.group(1), field.group(2)))
        end = field.end()
    if end < len(template):
        parts.append(F.lit(template[end:]))
    return parts[0] if len(parts) == 1 and end == 0 else F.concat(*parts)


def _words(rule: str, rule_ids: tuple[str, ...]) -> Column:
    chosen = F.when(F.col(rule) == F.lit(rule_ids[0]), render(TEMPLATES[rule_ids[0]]))
    for rule_id in rule_ids[1:]:
        chosen = chosen.when(F.col(rule) == F.lit(rule_id), render(TEMPLATES[rule_id]))
    return chosen


def advice_table(rules: DataFrame) -> DataFrame:
    """The ``advice`` table: :func:`~rabbitflow_pipeline.advice.advice_rules` with its words."""
    words = {
        "stop_advice": _words("stop_rule", tuple(rule.id for rule in STOP_RULES)),
        "resume_advice": _words("resume_rule", tuple(rule.id for rule in RESUME_RULES)),
    }
    return rules.select(*(words[c].alias(c) if c in words else F.col(c) for c in ADVICE_COLUMNS))
