"""The checks of a spec's schedules: a readable cron expression and time zone, a unique name, and
an input the flow takes. Problems go through the caller's `problem`."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterator
from typing import Any

import jsonschema
from croniter import croniter

from pgflow_gen.errors import excerpt
from pgflow_gen.spec import json_values, model
from pgflow_gen.spec.problems import Problem


def problems(spec: model.FlowSpec, problem: Any) -> Iterator[Problem]:
    """Each schedule's cron expression and time zone must be readable, its name unique, and
    its input a run input of the flow (checked against the flow's `input` schema)."""
    seen: set[str] = set()
    for index, schedule in enumerate(spec.schedules):
        at = ("schedules", index)
        name = schedule.resolved_name(index)
        if name in seen:
            yield problem(
                "duplicate_schedule_name",
                f'Two schedules are named "{name}".',
                (*at, "name"),
                hint="Give each schedule its own name.",
            )
        seen.add(name)
        if not croniter.is_valid(schedule.cron) or len(schedule.cron.split()) not in (5, 6):
            yield problem(
                "invalid_cron",
                f'Schedule "{name}" has an invalid cron expression {excerpt(repr(schedule.cron))}.',
                (*at, "cron"),
                hint='Five fields, minute hour day month weekday, such as "*/5 * * * *" or'
                ' "0 2 * * 1-5"; a sixth field, last, counts seconds.',
            )
        try:
            zoneinfo.ZoneInfo(schedule.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            yield problem(
                "invalid_timezone",
                f'Schedule "{name}" has an unknown time zone {excerpt(repr(schedule.timezone))}.',
                (*at, "timezone"),
                hint='Use an IANA name such as "UTC" or "Europe/Paris".',
            )
        bad = json_values.non_json(schedule.input)
        if bad is not None:
            yield problem(
                "not_json",
                f'The input of schedule "{name}" holds {bad}, which is not a JSON value.',
                (*at, "input"),
                hint="A run input is JSON: objects, arrays, strings, finite numbers, booleans"
                " and null.",
            )
        elif spec.input is not None:
            validator = jsonschema.Draft202012Validator(spec.input.as_json())
            for error in sorted(validator.iter_errors(schedule.input), key=str)[:1]:
                where = "$" + "".join(
                    f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path
                )
                yield problem(
                    "invalid_schedule_input",
                    f'The input of schedule "{name}" is not an input of flow "{spec.slug}".',
                    (*at, "input"),
                    detail=f"{where}: {error.message}",
                    hint="Give it what the flow's input schema asks for.",
                )
