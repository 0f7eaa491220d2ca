"""Spec loading: valid files load; every kind of problem is reported with its location."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator

import pytest

from pgflow_gen.spec import loader, model
from pgflow_gen.spec.problems import Problem, SpecErrors

VALID = """\
slug: communityThreadsV1
queue_mode: step
input:
  type: object
  properties: {thread_id: {type: string}, text: {type: string}}
  required: [thread_id, text]
steps:
  - slug: classify
    handler: app.handlers:classify
    output:
      type: object
      properties: {route: {enum: [help, spam, other]}}
      required: [route]
  - slug: deliverSlack
    depends_on: [classify]
    if: {classify: {route: help}}
    when_unmet: skip
    handler: app.handlers:deliver_slack
    output: {type: string}
    options: {max_attempts: 5, timeout: 30, start_delay: 0}
  - slug: listHelpers
    depends_on: [classify]
    handler: app.handlers:list_helpers
    output: {type: array, items: {type: string}}
  - slug: thankHelpers
    type: map
    array: listHelpers
    handler: app.handlers:thank_helper
workers:
  max_concurrent: 10
  steps:
    classify: {max_concurrent: 4}
"""


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(SpecErrors) as raised:
        loader.load_text(textwrap.dedent(text), "flows/f.yaml")
    return list(raised.value.problems)


def only(text: str) -> Problem:
    [problem] = problems_of(text)
    return problem


def test_loads_the_design_example() -> None:
    spec = loader.load_text(VALID, "flows/f.yaml")
    assert [s.slug for s in spec.steps] == [
        "classify",
        "deliverSlack",
        "listHelpers",
        "thankHelpers",
    ]
    assert spec.steps[1].if_ == {"classify": {"route": "help"}}
    assert spec.options == model.FlowOptions(max_attempts=3, base_delay=5, timeout=60)
    assert spec.workers.steps["classify"].max_concurrent == 4


def test_a_yaml_syntax_error_names_line_and_column() -> None:
    problem = only("slug: a\nsteps: [\n")
    assert problem.code == "yaml_syntax"
    assert (problem.location.file, problem.location.line) == ("flows/f.yaml", 3)


def test_a_duplicate_key_is_a_syntax_error() -> None:
    assert only("slug: a\nslug: b\n").code == "yaml_syntax"


def test_a_file_that_is_not_a_mapping_is_rejected() -> None:
    assert only("- just\n- a list\n").code == "not_a_mapping"


def test_unknown_keys_are_errors_with_their_position() -> None:
    problem = only(
        """\
        slug: a
        steps:
          - slug: b
            handler: app:b
            colour: red
        """
    )
    assert (problem.code, problem.location.line, problem.location.column) == ("unknown_key", 5, 5)
    assert problem.location.path == "steps[0].colour"


def test_every_schema_problem_is_reported_at_once() -> None:
    problems = problems_of(
        """\
        slug: a
        options: {max_attempts: 0, timeout: 2}
        steps:
          - slug: b
            handler: nope
        """
    )
    assert [p.code for p in problems] == ["out_of_range", "out_of_range", "invalid_handler_path"]
    assert [p.location.path for p in problems] == [
        "options.max_attempts",
        "options.timeout",
        "steps[0].handler",
    ]


def test_a_missing_handler_is_reported() -> None:
    problem = only("slug: a\nsteps:\n  - slug: b\n")
    assert (problem.code, problem.message) == ("missing_key", 'Missing required key "handler".')


def test_strings_are_not_numbers() -> None:
    assert only("slug: a\noptions: {timeout: '30'}\n").code == "invalid_value"


def test_an_unknown_queue_mode_lists_the_choices() -> None:
    problem = only("slug: a\nqueue_mode: steps\n")
    assert problem.code == "invalid_value"
    assert problem.hint is not None
    assert "'flow'" in problem.hint


def test_slug_and_dependency_problems_are_collected_together() -> None:
    problems = problems_of(
        """\
        slug: bad__flow
        steps:
          - slug: a
            handler: app:a
            depends_on: [b]
          - slug: b
            handler: app:b
          - slug: A
            handler: app:c
            depends_on: [missing]
        """
    )
    assert [(p.code, p.location.path) for p in problems] == [
        ("invalid_slug", "slug"),
        ("duplicate_step_slug", "steps[2].slug"),
        ("dependency_order", "steps[0].depends_on[0]"),
        ("unknown_dependency", "steps[2].depends_on[0]"),
    ]
    assert problems[2].hint is not None
    assert "dependency order" in problems[2].hint
    assert (problems[1].step_slug, problems[1].step_index) == ("A", 2)


def test_a_misspelt_dependency_suggests_the_exact_slug() -> None:
    problem = only(
        "slug: f\nsteps:\n  - {slug: fetchUser, handler: 'a:b'}\n"
        "  - {slug: b, handler: 'a:b', depends_on: [fetchuser]}\n"
    )
    assert problem.hint == 'Did you mean "fetchUser"? Slugs are exact.'


@pytest.mark.parametrize(
    ("steps", "code"),
    [
        (
            "- {slug: a, handler: 'x:a'}\n"
            "  - {slug: m, type: map, depends_on: [a], handler: 'x:m'}",
            "map_step_array",
        ),
        (
            "- {slug: a, handler: 'x:a'}\n  - {slug: b, handler: 'x:b'}\n"
            "  - {slug: m, type: map, depends_on: [a, b], handler: 'x:m'}",
            "map_step_dependencies",
        ),
        ("- {slug: a, handler: 'x:a', array: a}", "array_on_single_step"),
        ("- {slug: a, handler: 'x:a', when_unmet: fail}", "when_unmet_without_condition"),
        ("- {slug: a, handler: 'x:a', depends_on: [a]}", "self_dependency"),
        (
            "- {slug: a, handler: 'x:a'}\n  - {slug: b, handler: 'x:b', depends_on: [a, a]}",
            "duplicate_dependency",
        ),
    ],
)
def test_map_condition_and_dependency_rules(steps: str, code: str) -> None:
    assert only(f"slug: f\nsteps:\n  {steps}\n").code == code


def test_a_root_map_needs_an_array_input() -> None:
    problem = only(
        "slug: f\ninput: {type: object}\nsteps:\n  - {slug: m, type: map, handler: 'x:m'}\n"
    )
    assert (problem.code, problem.location.path) == ("root_map_needs_array_input", "input")


def test_step_mode_routes_are_checked_at_the_failing_step() -> None:
    steps = "".join(f"  - {{slug: s{i:02d}, handler: 'x:s'}}\n" for i in range(11))
    problem = only(f"slug: {'Orders' + 'x' * 38}\nqueue_mode: step\nsteps:\n{steps}")
    assert (problem.code, problem.location.path, problem.step_index) == (
        "step_queue_name_too_long",
        "steps[10].slug",
        10,
    )
    assert problem.detail == (
        "The readable name is 49 characters and the index fallback is 48; PGMQ allows at most 47."
    )


def test_an_empty_step_queued_flow_is_rejected() -> None:
    assert only("slug: f\nqueue_mode: step\n").code == "empty_step_queued_flow"


def test_worker_overrides_must_name_steps_in_step_mode() -> None:
    assert (
        only(
            "slug: f\nqueue_mode: step\nsteps:\n  - {slug: a, handler: 'x:a'}\n"
            "workers: {steps: {b: {max_concurrent: 2}}}\n"
        ).code
        == "unknown_worker_step"
    )
    assert (
        only(
            "slug: f\nsteps:\n  - {slug: a, handler: 'x:a'}\n"
            "workers: {steps: {a: {max_concurrent: 2}}}\n"
        ).code
        == "worker_overrides_need_step_mode"
    )


def test_type_schemas_are_checked() -> None:
    problems = problems_of(
        """\
        slug: f
        input:
          type: object
          properties: {a: {$ref: '#/$defs/Missing'}}
          required: [a, b]
        """
    )
    assert [p.code for p in problems] == ["required_not_a_property", "unresolved_ref"]


def test_errors_render_like_a_compiler() -> None:
    problem = only("slug: f\nsteps:\n  - {slug: a, handler: nope}\n")
    assert problem.render().splitlines()[0] == (
        "flows/f.yaml:3:15: error[invalid_handler_path] (steps[0].handler):"
        " Invalid handler path 'nope'."
    )


def test_enum_values_must_be_literal_types() -> None:
    problem = only("slug: f\ninput: {enum: [1.5, a]}\n")
    assert (problem.code, problem.location.path) == ("unsupported_literal", "input.enum")


def test_options_must_fit_the_engines_integer_columns() -> None:
    [problem] = problems_of(
        """\
        slug: a
        steps:
          - slug: b
            handler: app.h:b
            options: {timeout: 99999999999}
        """
    )
    assert (problem.code, problem.message, problem.detail) == (
        "out_of_range",
        '"timeout" must be at most 2147483647.',
        "Got 99999999999.",
    )


def test_an_empty_type_list_is_a_located_error() -> None:
    [problem] = problems_of(
        """\
        slug: a
        input: {type: []}
        steps: []
        """
    )
    assert (problem.code, problem.location.path) == ("invalid_value", "input.type")


CASCADES = """\
slug: orderProcessing
queue_mode: step
input:
  type: object
  properties: {order_id: {type: string}}
  required: [order_id]
steps:
  - slug: priceLines
    handler: app.handlers:price_lines
    output: {type: array, items: {type: number}}
  - slug: chargeLine
    type: map
    depends_on: [priceLines]
    array: priceLines
    handler: app.handlers:charge_line
  - slug: notify
    depends_on: [chargeLine, priceLines]
    if: {priceLines: [1]}
    if_not: {chargeLine: [0]}
    handler: app.handlers:notify
workers:
  steps:
    notify: {max_concurrent: 2}
"""


def references(text: str) -> Iterator[tuple[int, int, str]]:
    """Each place `text` names one of its steps other than where the step is defined (and
    its handler's path): (start, end, slug)."""
    for slug in ("priceLines", "chargeLine", "notify"):
        for found in re.finditer(rf"(?<![\w.:]){slug}\b", text):
            line = text[text.rfind("\n", 0, found.start()) + 1 : text.find("\n", found.start())]
            if not line.lstrip().startswith("- slug:"):
                yield found.start(), found.end(), slug


def test_each_misspelt_step_name_is_reported_once_with_the_right_slug() -> None:
    loader.load_text(CASCADES, "flows/f.yaml")  # valid as it is
    places = list(references(CASCADES))
    assert len(places) == 7  # depends_on x3, array, if, if_not, workers.steps
    for start, end, slug in places:
        typo = slug[:-1]
        [problem] = problems_of(CASCADES[:start] + typo + CASCADES[end:])
        assert problem.code in (
            "unknown_dependency", "condition_unknown_dependency", "unknown_worker_step",
            "map_step_array",  # "array" misspelt beside a right depends_on: name it there
        ), problem  # fmt: skip
        assert problem.hint is not None
        assert re.search(rf"\b{slug}\b", problem.hint), problem  # the right slug
        assert not re.search(rf"\b{typo}\b", problem.hint), problem  # never the typo


def test_a_condition_on_a_step_that_is_no_dependency_is_an_error() -> None:
    text = CASCADES.replace("if: {priceLines: [1]}", "if: {order_id: x}")
    problem = only(text)
    assert (problem.code, problem.location.path) == (
        "condition_unknown_dependency", "steps[2].if.order_id",
    )  # fmt: skip
    assert problem.message == (
        'The "if" condition of step "notify" names "order_id", which is not one of its'
        " dependencies."
    )
    assert problem.detail == (
        "A dependent step's condition matches its dependencies' outputs, keyed by their slugs:"
        " chargeLine, priceLines."
    )
