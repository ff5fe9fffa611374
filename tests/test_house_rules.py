"""The source tree's house rules, checked on the code itself: imports only go one way (no
circle, also none hidden in a function body or an ``if TYPE_CHECKING`` block; the product
``gems_fl`` never imports the lab ``gems_lab``), every package names its public face in
``__all__``, and no module imports another's ``_``-prefixed name (what is really shared
gets a public name)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = ROOT / "gems_fl"
LAB = ROOT / "gems_lab"
OURS = ("gems_fl", "gems_lab")


def _modules() -> dict[str, Path]:
    out = {}
    for path in [*PACKAGE.rglob("*.py"), *LAB.rglob("*.py")]:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _ours(module: str) -> bool:
    return module.split(".")[0] in OURS


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """Every ``gems_fl``/``gems_lab`` import of ``path``, wherever it sits: (module, name
    or '')."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and _ours(node.module):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append((sub, "") if sub in modules else (node.module, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if _ours(a.name)]
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:  # noqa: C901
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_anywhere_in_the_package():
    modules = _modules()
    graph = {m: {t for t, _ in _imports(p, modules) if t in modules and t != m}
             for m, p in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_product_never_imports_the_lab():
    """The product (``gems_fl``, the two app files) reaches the lab only through the entry
    points of ``gems_fl.extensions``: installed without the lab, it runs unchanged."""
    modules = _modules()
    files = [*PACKAGE.rglob("*.py"), ROOT / "server_app.py", ROOT / "client_app.py"]
    found = [f"{path.relative_to(ROOT)} imports {module}"
             for path in files for module, _ in _imports(path, modules)
             if module.split(".")[0] == "gems_lab"]
    assert found == []
    text_imports = [str(path.relative_to(ROOT)) for path in files
                    if "gems_lab" in path.read_text() and "import_module" in path.read_text()]
    assert text_imports == []  # nor by name at run time


def test_the_house_rule_sees_a_hidden_lab_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from gems_lab.reproduce import plan\n    import gems_lab\n")
    assert _imports(probe, _modules()) == [("gems_lab.reproduce.plan", ""), ("gems_lab", "")]


def test_every_package_names_its_public_face():
    for init in [*PACKAGE.rglob("__init__.py"), *LAB.rglob("__init__.py")]:
        tree = ast.parse(init.read_text())
        names = [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 if isinstance(t, ast.Name)]
        assert "__all__" in names, init.relative_to(ROOT)


def test_no_module_imports_another_modules_private_name():
    modules = _modules()
    files = [*PACKAGE.rglob("*.py"), *LAB.rglob("*.py"), *(ROOT / "tests").glob("*.py"),
             *(ROOT / "benchmarks").glob("*.py")]
    private = sorted(
        f"{path.relative_to(ROOT)}: {module}{'.' + name if name else ''}"
        for path in files for module, name in _imports(path, modules)
        if (name.startswith("_") and not name.startswith("__"))
        or any(part.startswith("_") and not part.startswith("__") for part in module.split(".")))
    assert private == []


def test_the_geometry_and_the_protocol_never_read_the_settings():
    """Both take explicit option objects (gems_fl.settings.options builds them): no import
    of the settings package, and no function that takes a ``settings`` argument."""
    modules = _modules()
    found = []
    for package in ("geometry", "protocol"):
        for path in (PACKAGE / package).rglob("*.py"):
            found += [f"{path.relative_to(ROOT)} imports {module}"
                      for module, _ in _imports(path, modules)
                      if module == "gems_fl.settings" or module.startswith("gems_fl.settings.")]
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found += [f"{path.relative_to(ROOT)}: {node.name}({a.arg})"
                              for a in node.args.args + node.args.kwonlyargs
                              if a.arg == "settings"]
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "settings":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads settings.{node.attr}")
                elif isinstance(node, ast.Attribute) and node.attr == "settings":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .settings")
    assert found == []


def _named(node: ast.AST, names: frozenset[str]) -> bool:
    """Whether ``node`` is one of ``names`` as a literal, or a literal tuple/list/set
    holding one."""
    if isinstance(node, ast.Constant) and node.value in names:
        return True
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
        isinstance(e, ast.Constant) and e.value in names for e in node.elts)


def _names_as_text(path: Path, names: frozenset[str], calls: bool) -> list[str]:
    """Where ``path`` compares one of ``names`` as text (``calls``: or passes one to a
    call)."""
    found = []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(
                _named(side, names) for side in (node.left, *node.comparators)):
            found.append(f"{where}:{node.lineno} compares {ast.unparse(node)}")
        elif calls and isinstance(node, ast.Call) and any(_named(a, names) for a in node.args):
            found.append(f"{where}:{node.lineno} passes {ast.unparse(node)}")
    return found


def _registered_names() -> list[tuple[str, frozenset[str], tuple[Path, ...], bool]]:
    """(what, its names, its registry's modules, whether passing a name to a call counts
    too). Models: a name is never passed around either; kinds and points: their names
    double as wire record names and result keys (``record["gram"]``), so only
    comparisons count."""
    from gems_fl.geometry.choices import SPACE_KINDS
    from gems_fl.geometry.points import POINTS
    from gems_fl.learning.model_kinds import MODELS

    geometry = PACKAGE / "geometry"
    return [("model", frozenset(MODELS), (PACKAGE / "learning" / "model_kinds.py",), True),
            ("space kind", frozenset(SPACE_KINDS),
             (geometry / "choices.py", geometry / "kinds.py"), False),
            ("point", frozenset(POINTS), (geometry / "points.py",), False)]


def _sources() -> list[Path]:
    return [*PACKAGE.rglob("*.py"), *LAB.rglob("*.py"), ROOT / "server_app.py",
            ROOT / "client_app.py"]


def test_no_model_kind_or_point_name_is_compared_as_a_string_outside_its_registry():
    """A model, a space kind and a Gram point are each one registered object
    (gems_fl.learning.model_kinds, gems_fl.geometry.choices/kinds, gems_fl.geometry.points):
    code asks the object (``settings.model_kind.layerwise``,
    ``settings.space_kind.statistics``, ``point_named(name).needs``), never compares a
    name as text, in the product or the lab, so the next one is one object and its
    tests."""
    found = []
    for what, names, registry, calls in _registered_names():
        for path in _sources():
            if path not in registry:
                found += [f"{line} (a {what} name)" for line in _names_as_text(path, names, calls)]
    assert found == []


def test_the_name_rule_sees_a_comparison_and_a_name_in_a_tuple(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('def f(s, kinds):\n    return s.space == "gram" or "lda" in kinds '
                     'or s.model in ("x", "mlp")\n')
    lines = {what: _names_as_text(probe, names, calls)
             for what, names, _, calls in _registered_names()}
    assert [len(v) for v in lines.values()] == [1, 1, 1]


#: where the run settings may be read whole: the settings package, the ServerApp, the
#: ClientApp's handlers and the entry points outside Flower; everything else takes option
#: objects (gems_fl.settings.options builds them)
SETTINGS_READERS = ("gems_fl.settings", "gems_fl.serverapp", "gems_fl.clientapp",
                    "gems_fl.running", "gems_fl.apps", "gems_fl.api", "gems_fl.estimator")


def test_only_the_entry_points_import_the_settings():
    modules = _modules()
    found = sorted(
        name for name, path in modules.items() if name.startswith("gems_fl")
        and not any(name == r or name.startswith(r + ".") for r in SETTINGS_READERS)
        and any(module == "gems_fl.settings" and imported in ("", "Settings")
                for module, imported in _imports(path, modules)))
    assert found == []


#: the most product functions outside gems_fl/settings that take the whole Settings (the
#: entry points' stages); the rest take the group or the option object they read
MAX_WHOLE_SETTINGS = 10


def _whole_settings_takers(path: Path) -> list[str]:
    return [f"{path.name}: {node.name}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(a.annotation is not None and ast.unparse(a.annotation).strip("'\"") == "Settings"
                    for a in node.args.args + node.args.kwonlyargs + node.args.posonlyargs)]


def test_few_functions_outside_the_settings_take_the_whole_settings():
    takers = [line for path in _product_sources()
              if not path.is_relative_to(PACKAGE / "settings")
              for line in _whole_settings_takers(path)]
    assert takers and len(takers) <= MAX_WHOLE_SETTINGS, "\n".join(takers)


def test_the_settings_rule_sees_a_taker(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def reads(settings: Settings, n: int):\n    return n\n\n\n"
                     "def small(data: DataSettings):\n    return data\n")
    assert [line.split(": ")[1] for line in _whole_settings_takers(probe)] == ["reads"]


#: the most product functions allowed over LONG_FUNCTION lines (docstring included), and
#: over ruff's complexity 10 (each marked `noqa: C901` in place; ruff checks the rest)
LONG_FUNCTION, MAX_LONG, MAX_TANGLED = 50, 15, 10


def _long_functions(path: Path) -> list[str]:
    return [f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]


def _product_sources() -> list[Path]:
    return [*PACKAGE.rglob("*.py"), ROOT / "server_app.py", ROOT / "client_app.py"]


def test_few_product_functions_are_long_or_tangled():
    """Long functions and tangled ones are split into named steps: at most MAX_LONG over
    LONG_FUNCTION lines and MAX_TANGLED that need ruff's complexity waiver."""
    long = [line for path in _product_sources() for line in _long_functions(path)]
    assert len(long) <= MAX_LONG, "\n".join(long)
    waived = [f"{path.name}:{i}" for path in _product_sources()
              for i, line in enumerate(path.read_text().splitlines(), 1) if "noqa: C901" in line]
    assert len(waived) <= MAX_TANGLED, "\n".join(waived)


def test_the_length_rule_sees_a_long_function(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def short():\n    return 1\n\n\ndef long():\n"
                     + "    x = 1\n" * LONG_FUNCTION + "    return x\n")
    assert [line.split()[1] for line in _long_functions(probe)] == ["long"]


def _fresh_python(code: str, heavy: tuple[str, ...]) -> list[str]:
    """Run ``code`` in a fresh interpreter in the checkout; its printed lines, the first
    naming which of ``heavy`` were imported by then (comma-separated, empty for none)."""
    import subprocess
    import sys

    code += f"\nprint(','.join(m for m in {heavy!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_the_apps_start_without_the_heavy_libraries_they_use_on_some_paths_only():
    """Every Flower process (the ServerApp, each ClientApp actor) imports the two app
    files: scikit-learn (1-3 s), pandas and matplotlib load where a path needs them
    (k-means, a CSV, a plot), not at start-up."""
    assert _fresh_python("import client_app, server_app",
                         ("sklearn", "pandas", "matplotlib")) == [""]


def test_the_command_that_runs_a_simulation_holds_no_torch_and_no_flower_while_it_waits():
    """``gems-fl run`` starts the SuperLink and waits on the run for its whole length: its
    own process imports neither torch nor Flower (the run's processes do), which kept
    about 450 MB more resident at every run's peak."""
    assert _fresh_python("import gems_fl.running.cli, gems_fl.running.launch",
                         ("torch", "flwr", "sklearn", "ray")) == [""]


def test_the_checks_before_a_run_leave_the_dataset_and_its_libraries_out_of_the_cli():
    """The preflight's division check loads the dataset and flwr-datasets (pandas,
    pyarrow): it runs in a child process, so ``gems-fl run`` does not hold them while it
    waits on the run; a division it refuses is still refused, with its message."""
    code = ("from gems_fl.running.prepare import prepare_run\n"
            "try:\n"
            f"    prepare_run({str(ROOT)!r}, num_nodes=2, "
            "run_config=\"min-replies=3 output-dir='/tmp'\")\n"
            "except ValueError as exc:\n"
            "    print('refused:', exc)\n"
            f"prepare_run({str(ROOT)!r}, num_nodes=5, "
            "run_config=\"label-division='dirichlet:0.5' output-dir='/tmp'\")")
    refusal, loaded = _fresh_python(
        code, ("pandas", "pyarrow", "datasets", "flwr_datasets", "sklearn", "torch"))
    assert loaded == ""
    assert refusal.startswith("refused:") and "min-replies" in refusal
