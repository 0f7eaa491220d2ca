"""From the spec's JSON Schema subset to Python type expressions and TypedDict declarations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pgflow_gen.codegen import layout, literals, names
from pgflow_gen.codegen.layout import Atom, Expr, Group, Pair
from pgflow_gen.codegen.names import NameAllocator
from pgflow_gen.spec import model

JSON = Atom("Json")
_SCALARS = {
    "string": Atom("str"),
    "integer": Atom("int"),
    "number": Atom("float"),
    "boolean": Atom("bool"),
    "null": Atom("None"),
}


@dataclass(frozen=True)
class Field:
    key: str
    annotation: Expr
    required: bool

    @property
    def rendered(self) -> Expr:
        return self.annotation if self.required else subscript("NotRequired", self.annotation)

    @property
    def class_line(self) -> str:
        """`key: annotation` in a class body, laid out over lines when long."""
        return layout.text(self.rendered, indent=4, prefix=f"{self.key}: ")

    @property
    def entry_line(self) -> str:
        """`"key": annotation,` in the functional form's dict."""
        return layout.text(
            Pair(literals.string(self.key), ": ", self.rendered), indent=8, suffix=","
        )


def subscript(head: str, *items: Expr) -> Group:
    return Group(head, "[", "]", items)


def union(options: list[Expr]) -> Expr:
    """`A | B`, flattened and without repeats; one option stands for itself."""
    flattened: dict[str, Expr] = {}
    for option in options:
        for item in option.items if isinstance(option, layout.Union) else (option,):
            flattened.setdefault(layout.flat(item), item)
    # None goes last, as ruff wants it (RUF036).
    items = tuple(sorted(flattened.values(), key=lambda item: item == Atom("None")))
    return items[0] if len(items) == 1 else layout.Union(items)


@dataclass(frozen=True)
class TypedDictDecl:
    name: str
    fields: tuple[Field, ...]
    description: str | None = None

    @property
    def docstring(self) -> str | None:
        return literals.docstring(self.description, indent=4)

    @property
    def class_syntax(self) -> bool:
        """Class syntax needs keys that stay as they are; others use the functional form."""
        return all(names.is_class_key(f.key) for f in self.fields)


@dataclass(frozen=True)
class AliasDecl:
    name: str
    annotation: Expr

    @property
    def line(self) -> str:
        return layout.text(self.annotation, indent=0, prefix=f"{self.name}: TypeAlias = ")


Decl = TypedDictDecl | AliasDecl


Scope = dict[str, str]
"""A schema's `$defs` entries by key -> the names of their declarations."""


@dataclass
class TypeBuilder:
    """Collects the declarations a flow's schemas need, in dependency order. Contract names are
    declared as they are; nested ones come unique from the allocator."""

    names: NameAllocator
    decls: list[Decl] = field(default_factory=list)

    def declare(self, decl: Decl) -> None:
        self.names.contract(decl.name)
        self.decls.append(decl)

    def named(
        self, name: str, schema: model.TypeSchema | None, scope: Scope | None = None
    ) -> Scope:
        """Declare the contract name `name` for `schema` (a TypedDict for an object with
        properties, else an alias). A root schema (no `scope`) declares its `$defs` first;
        returns the scope its `$ref`s resolve in."""
        if schema is None:
            self.declare(AliasDecl(name, JSON))
            return {}
        if scope is None:
            scope = self._definitions(name, schema.defs or {})
        self.names.contract(name)
        self._declare_as(name, schema, scope)
        return scope

    def _definitions(self, owner: str, definitions: dict[str, model.TypeSchema]) -> Scope:
        """Name every `$defs` entry, then declare them so that each follows those it refers to
        (validation has rejected cycles)."""
        scope = {key: self.names.nested(f"{owner}{names.nested_part(key)}") for key in definitions}
        declared: set[str] = set()

        def declare(key: str, path: tuple[str, ...]) -> None:
            if key in declared:
                return
            if key in path:
                raise ValueError(f"$defs entry {key!r} refers to itself")
            for ref in sorted(definitions[key].referenced_defs()):
                declare(ref, (*path, key))
            declared.add(key)
            self._declare_as(scope[key], definitions[key], scope)

        for key in definitions:
            declare(key, ())
        return scope

    def _declare_as(self, name: str, schema: model.TypeSchema, scope: Scope) -> None:
        if _is_record(schema):
            self._typed_dict(name, schema, scope)
        else:
            self.decls.append(AliasDecl(name, self.expression(schema, name, scope)))

    def expression(self, schema: model.TypeSchema, context: str, scope: Scope) -> Expr:
        """A type expression for `schema`; nested records get TypedDicts named after `context`."""
        if schema.ref is not None:
            return Atom(scope[schema.ref.removeprefix(model.REF_PREFIX)])
        if schema.const is not None or "const" in schema.model_fields_set:
            return self._literal([schema.const])
        if schema.enum is not None:
            return self._literal(schema.enum)
        if schema.any_of is not None:
            return union(
                [
                    self.expression(option, f"{context}Option{i}", scope)
                    for i, option in enumerate(schema.any_of)
                ]
            )
        kinds = schema.type if isinstance(schema.type, list) else [schema.type]
        return union([self._kind(kind, schema, context, scope) for kind in kinds])

    def _kind(self, kind: str | None, schema: model.TypeSchema, context: str, scope: Scope) -> Expr:
        if kind is None:
            return JSON
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            item = (
                JSON
                if schema.items is None
                else self.expression(schema.items, f"{context}Item", scope)
            )
            return subscript("list", item)
        # object
        if _is_record(schema):
            name = self.names.nested(context)
            self._typed_dict(name, schema, scope)
            return Atom(name)
        extra = schema.additional_properties
        value = (
            self.expression(extra, f"{context}Value", scope)
            if isinstance(extra, model.TypeSchema)
            else JSON
        )
        return subscript("dict", Atom("str"), value)

    def _typed_dict(self, name: str, schema: model.TypeSchema, scope: Scope) -> None:
        required = set(schema.required or [])
        fields = []
        for key, child in (schema.properties or {}).items():
            annotation = self.expression(child, f"{name}{names.nested_part(key)}", scope)
            fields.append(Field(key, annotation, key in required))
        self.decls.append(TypedDictDecl(name, tuple(fields), schema.description))

    def _literal(self, values: list[Any]) -> Expr:
        return subscript("Literal", *(Atom(literals.literal(v)) for v in values))


def _is_record(schema: model.TypeSchema) -> bool:
    kinds = schema.type if isinstance(schema.type, list) else [schema.type]
    return kinds == ["object"] and bool(schema.properties)
