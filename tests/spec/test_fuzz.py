"""Random and mutated specs never crash the loader: they load or raise SpecErrors."""

from __future__ import annotations

import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgflow_gen.spec import loader
from pgflow_gen.spec.problems import Problem, SpecErrors
from tests.spec.test_loader import VALID

KEYS = [
    "slug",
    "steps",
    "handler",
    "depends_on",
    "type",
    "array",
    "if",
    "if_not",
    "options",
    "when_unmet",
    "queue_mode",
    "input",
    "output",
    "workers",
    "max_concurrent",
    "timeout",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 200),
    st.floats(allow_nan=False),
    st.text(string.ascii_letters + "_:.-0123456789 ", max_size=60),
    st.sampled_from(KEYS),
)
YAMLISH = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.sampled_from(KEYS), children, max_size=5)
    ),
    max_leaves=25,
)


def load_quietly(text: str) -> None:
    problems: tuple[Problem, ...] = ()
    try:
        loader.load_text(text, "fuzz.yaml")
    except SpecErrors as errors:
        problems = errors.problems
        assert problems, "SpecErrors without a problem"
    for problem in problems:
        assert problem.code
        assert problem.message
        assert problem.location.file == "fuzz.yaml"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_random_text_never_crashes_the_loader(text: str) -> None:
    load_quietly(text)


@settings(max_examples=100, deadline=None)
@given(YAMLISH)
def test_random_structures_never_crash_the_loader(document: object) -> None:
    import io

    from ruamel.yaml import YAML

    buffer = io.StringIO()
    YAML(typ="safe").dump(document, buffer)
    load_quietly(buffer.getvalue())


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(VALID) - 1), st.integers(0, 40), st.text(max_size=8))
def test_mutations_of_a_valid_spec_never_crash_the_loader(
    start: int, length: int, insert: str
) -> None:
    load_quietly(VALID[:start] + insert + VALID[start + length :])
