"""From the spec's JSON Schema subset to Python type expressions and TypedDict declarations."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pgflow_gen.codegen import names
from pgflow_gen.spec import model

JSON = "Json"
_SCALARS = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
}


@dataclass(frozen=True)
class Field:
    key: str
    annotation: str
    required: bool

    @property
    def rendered(self) -> str:
        return self.annotation if self.required else f"NotRequired[{self.annotation}]"


@dataclass(frozen=True)
class TypedDictDecl:
    name: str
    fields: tuple[Field, ...]
    description: str | None = None

    @property
    def class_syntax(self) -> bool:
        """Class syntax needs identifier keys; others use the functional form."""
        return all(names.is_identifier(f.key) for f in self.fields)


@dataclass(frozen=True)
class AliasDecl:
    name: str
    annotation: str


Decl = TypedDictDecl | AliasDecl


@dataclass
class TypeBuilder:
    """Collects the declarations a schema needs, in dependency order, without duplicates."""

    decls: list[Decl] = field(default_factory=list)
    _taken: set[str] = field(default_factory=set)

    def declare(self, decl: Decl) -> None:
        if decl.name in self._taken:
            raise ValueError(f"type name {decl.name} is generated twice")
        self._taken.add(decl.name)
        self.decls.append(decl)

    def named(self, name: str, schema: model.TypeSchema | None) -> None:
        """Declare `name` for `schema`: a TypedDict for an object with properties, else an alias."""
        if schema is None:
            self.declare(AliasDecl(name, JSON))
            return
        defs = {key: f"{name}{names.pascal_case(key)}" for key in (schema.defs or {})}
        for key, definition in (schema.defs or {}).items():
            self.named(defs[key], definition)
        if _is_record(schema):
            self._typed_dict(name, schema, defs)
        else:
            self.declare(AliasDecl(name, self.expression(schema, name, defs)))

    def expression(self, schema: model.TypeSchema, context: str, defs: dict[str, str]) -> str:
        """A type expression for `schema`; nested records get TypedDicts named after `context`."""
        if schema.ref is not None:
            return defs[schema.ref.removeprefix("#/$defs/")]
        if schema.const is not None or "const" in schema.model_fields_set:
            return self._literal([schema.const])
        if schema.enum is not None:
            return self._literal(schema.enum)
        if schema.any_of is not None:
            options = [
                self.expression(option, f"{context}Option{i}", defs)
                for i, option in enumerate(schema.any_of)
            ]
            return " | ".join(dict.fromkeys(options))
        kinds = schema.type if isinstance(schema.type, list) else [schema.type]
        rendered = [self._kind(kind, schema, context, defs) for kind in kinds]
        return " | ".join(dict.fromkeys(rendered))

    def _kind(
        self, kind: str | None, schema: model.TypeSchema, context: str, defs: dict[str, str]
    ) -> str:
        if kind is None:
            return JSON
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            item = (
                JSON
                if schema.items is None
                else self.expression(schema.items, f"{context}Item", defs)
            )
            return f"list[{item}]"
        # object
        if _is_record(schema):
            self._typed_dict(context, schema, defs)
            return context
        extra = schema.additional_properties
        value = (
            self.expression(extra, f"{context}Value", defs)
            if isinstance(extra, model.TypeSchema)
            else JSON
        )
        return f"dict[str, {value}]"

    def _typed_dict(self, name: str, schema: model.TypeSchema, defs: dict[str, str]) -> None:
        required = set(schema.required or [])
        fields = []
        for key, child in (schema.properties or {}).items():
            annotation = self.expression(child, f"{name}{names.pascal_case(_word(key))}", defs)
            fields.append(Field(key, annotation, key in required))
        self.declare(TypedDictDecl(name, tuple(fields), schema.description))

    def _literal(self, values: list[Any]) -> str:
        literals = [_python_literal(v) for v in values]
        return f"Literal[{', '.join(literals)}]"


def _is_record(schema: model.TypeSchema) -> bool:
    kinds = schema.type if isinstance(schema.type, list) else [schema.type]
    return kinds == ["object"] and bool(schema.properties)


def _word(key: str) -> str:
    """A property key as a name part: non-identifier characters become underscores."""
    return "".join(c if c.isalnum() else "_" for c in key)


def _python_literal(value: Any) -> str:
    if value is None or isinstance(value, bool | int | str):
        return json.dumps(value) if isinstance(value, str) else repr(value)
    raise ValueError(f"Literal values must be strings, integers, booleans or null, got {value!r}")
