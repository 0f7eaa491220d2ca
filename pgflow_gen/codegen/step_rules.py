"""What a step's spec means for the types around it: what it depends on, and whether it can
end skipped (so its output is optional where others read it)."""

from __future__ import annotations

from pgflow_gen.spec import model


def dependencies(step: model.StepSpec) -> tuple[str, ...]:
    if step.type == "map" and step.array is not None:
        return (step.array,)
    return tuple(step.depends_on)


def skippable(step: model.StepSpec) -> bool:
    """Whether the step can be skipped while its dependents still run (plain `skip`)."""
    has_condition = step.if_ is not None or step.if_not is not None
    unmet = step.when_unmet or "skip"
    return (has_condition and unmet == "skip") or step.when_exhausted == "skip"


def may_vanish(step: model.StepSpec) -> bool:
    """Whether the step can end skipped in any way (then a leaf's output is absent)."""
    has_condition = step.if_ is not None or step.if_not is not None
    return (
        has_condition and (step.when_unmet or "skip") != "fail"
    ) or step.when_exhausted != "fail"


def cascades(step: model.StepSpec) -> bool:
    has_condition = step.if_ is not None or step.if_not is not None
    return (has_condition and step.when_unmet == "skip-cascade") or (
        step.when_exhausted == "skip-cascade"
    )


def ancestor_cascades(spec: model.FlowSpec, step: model.StepSpec, index_of: dict[str, int]) -> bool:
    pending = list(dependencies(step))
    seen: set[str] = set()
    while pending:
        slug = pending.pop()
        if slug in seen:
            continue
        seen.add(slug)
        ancestor = spec.steps[index_of[slug]]
        if cascades(ancestor):
            return True
        pending.extend(dependencies(ancestor))
    return False
