"""The spec and code generation commands of `pgflow-gen`: `init` (a new project), `validate`,
`build` and `graph`. They read spec files and write generated code; no database."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pgflow_gen import naming
from pgflow_gen.cli import parser as cli_parser
from pgflow_gen.cli import project as project_module
from pgflow_gen.cli.exits import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from pgflow_gen.cli.output import print_json
from pgflow_gen.codegen import build as build_module
from pgflow_gen.codegen import graph as graph_module
from pgflow_gen.codegen import handler_imports, origin, scaffold
from pgflow_gen.errors import UsageError
from pgflow_gen.spec import loader
from pgflow_gen.spec import problems as problems_module
from pgflow_gen.words import counted

#: The help of the spec paths `validate`, `build` and `graph` take.
PATHS_HELP = "spec files or folders of *.yaml (default: [tool.pgflow-gen] specs)"


def _spec_paths(given: list[Path]) -> list[Path]:
    """The spec paths given, else `[tool.pgflow-gen] specs`; UsageError when neither is."""
    paths = given or [Path(p) for p in project_module.config(Path.cwd()).get("specs", [])]
    if not paths:
        raise UsageError(
            "pass spec files or folders, or set `specs` under [tool.pgflow-gen] in pyproject.toml."
        )
    return paths


def register(commands: cli_parser.Commands) -> None:
    """Add `init`, `validate`, `build` and `graph` to the `pgflow-gen` parser."""
    init = commands.add("init", "create a project: a flow, typed handlers, a test")
    init.add_argument(
        "folder", nargs="?", type=Path, default=Path("."), help="the project folder (created)"
    )
    init.set_defaults(handler=_init)

    validate = commands.add(
        "validate", "check flow spec files (exit 2 when invalid)", formats=("text", "json")
    )
    validate.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help=PATHS_HELP,
    )
    validate.add_argument(
        "--check-handlers",
        action="store_true",
        help="also import each step's handler from this project, as its worker will (runs the"
        " handler modules' top-level code)",
    )
    validate.set_defaults(handler=_validate)

    build = commands.add("build", "generate typed modules, workers and migrations")
    build.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="spec files or folders (default: [tool.pgflow-gen] specs)",
    )
    build.add_argument(
        "--out", type=Path, help="output folder, e.g. app/pgflow (default: [tool.pgflow-gen] out)"
    )
    build.add_argument(
        "--package",
        help="Python package of --out (default: [tool.pgflow-gen] package, else derived from the"
        " path)",
    )
    build.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 with a diff when stale"
    )
    build.set_defaults(handler=_build)

    graph = commands.add(
        "graph",
        "print flow DAGs (Mermaid or Graphviz DOT)",
        formats=("mermaid", "dot", "json"),
        format_help="graph language, or json for the DAG's metadata",
    )
    graph.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help=PATHS_HELP,
    )
    graph.set_defaults(handler=_graph)


def _init(args: argparse.Namespace) -> int:
    folder: Path = args.folder
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} exists and is not a folder.")
    name = scaffold.project_name(folder.resolve().name)
    files = scaffold.project_files(name, origin.installed_requirement())
    taken = [path for path in files if (folder / path).exists()]
    if taken:
        raise UsageError(
            f"{folder} already has {', '.join(taken)}; init writes nothing over existing files.",
            hint="Run it in a new or empty folder: `pgflow-gen init my-flows`.",
        )
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("x", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        print(f"created {target}")
    print("\nnext:")
    if folder.resolve() != Path.cwd().resolve():
        print(f"  cd {folder}")
    print("  python3 -m venv .venv && . .venv/bin/activate")
    print("  pip install -e '.[test]'   # pgflow-gen as installed for init, pytest, mypy")
    print("  pgflow-gen build           # generate app/pgflow from flows/hello.yaml")
    print("  pytest -q                  # run tests/test_hello.py through the engine")
    print("  pgflow-gen dev             # run every worker; rebuild and restart on changes")
    return EXIT_OK


def _validate(args: argparse.Namespace) -> int:
    problems: list[problems_module.Problem] = []
    args.paths = _spec_paths(args.paths)
    files = project_module.spec_files(args.paths)
    try:
        loaded = build_module.load(files, project=Path.cwd())
    except problems_module.SpecErrors as exc:
        problems.extend(exc.problems)
    else:
        if args.check_handlers:
            problems.extend(handler_imports.unimportable(loaded, Path.cwd()))
    if not files:
        problems.append(
            problems_module.Problem(
                "no_specs",
                "No spec files found.",
                problems_module.Location(", ".join(str(p) for p in args.paths)),
                hint="Pass *.yaml files or folders that contain them.",
            )
        )
    if args.format == "json":
        print(json.dumps({"ok": not problems, "errors": [p.to_json() for p in problems]}, indent=2))
    else:
        for problem in problems:
            print(problem.render(), file=sys.stderr)
        if not problems:
            print(f"{counted(len(files), 'spec file')} valid")
        else:
            print(f"{counted(len(problems), 'problem')} in {counted(len(files), 'file')}",
                  file=sys.stderr)  # fmt: skip
    return EXIT_OK if not problems else EXIT_USAGE


def _build(args: argparse.Namespace) -> int:
    project = Path.cwd()
    config = project_module.config(project)
    paths = args.paths or [Path(p) for p in config.get("specs", [])]
    out = args.out or (Path(config["out"]) if "out" in config else None)
    if not paths or out is None:
        print(
            "error: pass spec paths and --out, or set `specs` and `out` under [tool.pgflow-gen]"
            " in pyproject.toml",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder.")
    args.out = out
    files = project_module.spec_files(paths)
    try:
        package = args.package or config.get("package") or build_module.package_for(out, project)
        loaded = build_module.load(files, project=project)
        generated = build_module.generate_loaded(loaded, package=package)
    except problems_module.SpecErrors as exc:
        for problem in exc.problems:
            print(problem.render(), file=sys.stderr)
        return EXIT_USAGE
    except naming.FlowSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for warning in build_module.unfound_handler_modules(loaded, project):
        print(warning, file=sys.stderr)
    outcome = build_module.apply(generated, args.out, check=args.check)
    if args.check:
        if outcome.stale:
            sys.stdout.write("".join(outcome.diffs))
            print(
                f"{len(outcome.written)} changed or missing, {len(outcome.removed)} orphaned:"
                " run `pgflow-gen build` and commit the result",
                file=sys.stderr,
            )
            return EXIT_FAILURE
        verb = "is" if outcome.unchanged == 1 else "are"
        print(f"{counted(outcome.unchanged, 'generated file')} {verb} current")
        return EXIT_OK
    for path in outcome.written:
        print(f"wrote   {args.out / path}")
    for path in outcome.removed:
        print(f"removed {args.out / path}")
    print(
        f"{len(outcome.written)} written, {len(outcome.removed)} removed,"
        f" {outcome.unchanged} unchanged"
    )
    # With the generated code in place, a handler module that imports cleanly must hold its
    # handler: a misspelt function name is a warning here, not a worker failing in a loop.
    for problem in handler_imports.unimportable(loaded, project, cleanly_imported_only=True):
        print(problem.render("warning"), file=sys.stderr)
    return EXIT_OK


def _graph(args: argparse.Namespace) -> int:
    args.paths = _spec_paths(args.paths)
    files = project_module.spec_files(args.paths)
    if not files:
        raise UsageError(
            f"No spec files found in {', '.join(map(str, args.paths))}.",
            hint="Pass *.yaml files or folders that contain them.",
        )
    problems: list[problems_module.Problem] = []
    graphs = []
    flows = []
    for path in files:
        shown = build_module.display_path(path, Path.cwd())
        try:
            spec = loader.load_file(path, display_name=shown)
        except problems_module.SpecErrors as exc:
            problems.extend(exc.problems)
            continue
        if args.format == "json":
            flows.append({"source": shown, **graph_module.metadata(spec)})
        else:
            graphs.append(graph_module.render(spec, args.format))
    if problems:
        for problem in problems:
            print(problem.render(), file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        print_json({"flows": flows})
    else:
        sys.stdout.write("\n".join(graphs))
    return EXIT_OK
