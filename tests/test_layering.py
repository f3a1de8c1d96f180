"""The import direction between dlprof's layers, read from the source with ``ast``.

Data flows one way (ARCHITECTURE.md): collectors or importers → session → store → analysis →
exporters and viewers → cli. A lower layer that imports a higher one drags its dependencies (and
their import-time cost) into every program that only wanted the lower one, and invites cycles.
Like perfetto's ``python/tools/check_imports.py``, the rules are a table, checked against every
import statement in every module, including imports inside functions: a lazy import of a higher
layer is still a dependency on it. ``importlib.import_module("dlprof.x...")`` counts too.

The optional frameworks and hardware libraries are extras; the core imports none of them when a
module loads, only inside the functions that use them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pytest

import dlprof

PACKAGE = "dlprof"
PACKAGE_DIR = Path(dlprof.__file__).parent


class Layer(StrEnum):
    """dlprof's layers, low to high."""

    CORE = "keys/config/clock/schedule"
    STORE = "store"
    SUPPORT = "support"
    IMPORTERS = "importers"
    COLLECTORS = "collectors"
    SESSION = "session/region/runner"
    ANALYSIS = "analysis"
    EXPORTERS = "exporters"
    VIEWERS = "viewers"
    CLI = "cli"
    # The package itself (profile(), region(), load()) and `python -m dlprof`: it imports the
    # session, so below the top nothing may import it.
    API = "dlprof (package face)"


# Modules and packages to layers; a module belongs to the layer of its longest listed prefix.
LAYER_OF: dict[str, Layer] = {
    "dlprof.keys": Layer.CORE,
    "dlprof.config": Layer.CORE,
    "dlprof.clock": Layer.CORE,
    "dlprof.schedule": Layer.CORE,
    "dlprof.distributed": Layer.CORE,
    "dlprof.hardware": Layer.CORE,  # the device table: data, no layer above it
    "dlprof.text": Layer.CORE,  # text from data made safe to print, for every layer's messages
    "dlprof.store": Layer.STORE,
    "dlprof.support": Layer.SUPPORT,
    # The query engines are the store's reading side: Run.engine opens one over the run's files.
    "dlprof.engine": Layer.STORE,
    "dlprof.importers": Layer.IMPORTERS,
    "dlprof.collectors": Layer.COLLECTORS,
    # The recording path: the session and what runs beside the program (saves, the finisher).
    "dlprof.recording": Layer.SESSION,
    # Workloads dlprof runs itself (calibration kernels, sweep models): framework code on the core.
    "dlprof.workloads": Layer.SESSION,
    "dlprof.analysis": Layer.ANALYSIS,
    "dlprof.advice": Layer.ANALYSIS,  # rules that read analyses and say what to change
    "dlprof.exporters": Layer.EXPORTERS,
    "dlprof.viewers": Layer.VIEWERS,
    "dlprof.cli": Layer.CLI,
    "dlprof.__main__": Layer.API,
    "dlprof": Layer.API,  # exactly the package, never a prefix of an unlisted module
}

_ABOVE_SESSION = {Layer.ANALYSIS, Layer.EXPORTERS, Layer.VIEWERS, Layer.CLI, Layer.API}

# What each layer must never import. Not only higher layers: analysis reads runs, so it has no
# business with collectors either, and exporters and viewers take analysis results, never live
# collection.
FORBIDDEN: dict[Layer, frozenset[Layer]] = {
    Layer.CORE: frozenset(Layer) - {Layer.CORE},
    Layer.STORE: frozenset({Layer.SUPPORT, Layer.IMPORTERS, Layer.COLLECTORS, Layer.SESSION, *_ABOVE_SESSION}),
    # What the collectors stand on (perf_event, demangling, import watches): no collector in it.
    Layer.SUPPORT: frozenset({Layer.IMPORTERS, Layer.COLLECTORS, Layer.SESSION, *_ABOVE_SESSION}),
    Layer.IMPORTERS: frozenset({Layer.COLLECTORS, Layer.SESSION, *_ABOVE_SESSION}),
    # Collectors hand their profiler cycles over as the store's save-job records; converting them
    # is the finisher's business, so no collector imports an importer.
    Layer.COLLECTORS: frozenset({Layer.IMPORTERS, Layer.SESSION, *_ABOVE_SESSION}),
    Layer.SESSION: frozenset(_ABOVE_SESSION),
    Layer.ANALYSIS: frozenset({Layer.COLLECTORS, Layer.SESSION, *_ABOVE_SESSION} - {Layer.ANALYSIS}),
    Layer.EXPORTERS: frozenset({Layer.COLLECTORS, Layer.SESSION, Layer.CLI, Layer.API}),
    Layer.VIEWERS: frozenset({Layer.COLLECTORS, Layer.SESSION, Layer.CLI, Layer.API}),
    Layer.CLI: frozenset(),
    Layer.API: frozenset(),
}

# Optional extras (torch, tensorflow-cpu, cupti-python, nvidia-ml-py, python-papi) and JAX, by
# the top-level name they are imported under.
FRAMEWORKS = frozenset({"torch", "tensorflow", "jax", "cupti", "pynvml", "pypapi"})


@dataclass(frozen=True)
class Import:
    """One import of one module: what it names and where."""

    module: str  # the importing module, dotted
    target: str  # the imported module, dotted and absolute
    line: int
    top_level: bool  # runs when the module loads (not inside a function or TYPE_CHECKING)

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def layer_of(module: str) -> Layer | None:
    """The layer of a dlprof module, or None when no rule places it."""
    if module == PACKAGE:
        return Layer.API
    parts = module.split(".")
    for end in range(len(parts), 1, -1):
        layer = LAYER_OF.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    return None


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names, resolving leading dots."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _dynamic_target(node: ast.Call) -> str | None:
    """The module an ``importlib.import_module("dlprof....")`` call names, up to any f-string hole."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if called != "import_module" or not node.args:
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).rstrip(".")
    return None


class _Collector(ast.NodeVisitor):
    """Every import of one module, noting whether it runs at module load."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.is_package = is_package
        self.imports: list[Import] = []
        self._deferred = 0  # > 0 inside a function body or an `if TYPE_CHECKING:` block

    def _add(self, target: str, node: ast.AST) -> None:
        line = getattr(node, "lineno", 0)
        self.imports.append(Import(self.module, target, line, self._deferred == 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        target = _absolute(self.module, self.is_package, node)
        for alias in node.names:
            # `from dlprof import store` names a subpackage; `from dlprof import load` a name.
            submodule = f"{target}.{alias.name}"
            self._add(submodule if submodule in MODULES else target, node)

    def visit_Call(self, node: ast.Call) -> None:
        target = _dynamic_target(node)
        if target is not None:
            self._add(target, node)
        self.generic_visit(node)

    def _deferring(self, node: ast.AST) -> None:
        self._deferred += 1
        self.generic_visit(node)
        self._deferred -= 1

    visit_FunctionDef = _deferring
    visit_AsyncFunctionDef = _deferring
    visit_Lambda = _deferring

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", "")
        if name == "TYPE_CHECKING":
            self._deferring(node)
        else:
            self.generic_visit(node)


def imports_of(module: str) -> list[Import]:
    path = MODULES[module]
    collector = _Collector(module, path.name == "__init__.py")
    collector.visit(ast.parse(path.read_text(), filename=str(path)))
    return collector.imports


ALL_IMPORTS = [i for m in MODULES for i in imports_of(m)]


def violations(layer: Layer) -> list[str]:
    """Each import from a module of ``layer`` into a layer it must not import."""
    found = []
    for imported in ALL_IMPORTS:
        if layer_of(imported.module) is not layer:
            continue
        if imported.target != PACKAGE and not imported.target.startswith(PACKAGE + "."):
            continue
        target_layer = layer_of(imported.target)
        if target_layer in FORBIDDEN[layer]:
            found.append(f"{imported} ({target_layer})")
    return found


# Rules the current code breaks, with why; each becomes an xfail until the code is fixed.
KNOWN_VIOLATIONS: dict[Layer, str] = {}


def test_the_checker_sees_the_package() -> None:
    # Guards against a rule table that passes because it checked nothing.
    assert {"dlprof.store.reader", "dlprof.recording.session", "dlprof.cli.main"} <= set(MODULES)
    assert any(i.target == "dlprof.store.reader" for i in ALL_IMPORTS)


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in MODULES if layer_of(m) is None]
    assert unplaced == [], f"add these to LAYER_OF in {__file__}: {unplaced}"


def test_every_layer_has_a_rule() -> None:
    assert set(FORBIDDEN) == set(Layer)
    assert all(layer not in forbidden for layer, forbidden in FORBIDDEN.items())


# The commands that record or finish a run; every other command only reads, so it never imports
# the recording path (which is what writes a run).
RECORDING_COMMANDS = frozenset({"dlprof.cli.run", "dlprof.cli.finish", "dlprof.cli.sweep", "dlprof.cli.calibrate"})


def test_reading_commands_never_import_the_recording_path() -> None:
    found = [str(i) for i in ALL_IMPORTS
             if i.module.startswith("dlprof.cli.") and i.module not in RECORDING_COMMANDS
             and layer_of(i.target) is Layer.SESSION]
    assert found == []


@pytest.mark.parametrize("layer", list(Layer), ids=lambda layer: layer.name.lower())
def test_layers_import_only_what_they_may(layer: Layer) -> None:
    if layer in KNOWN_VIOLATIONS:
        pytest.xfail(KNOWN_VIOLATIONS[layer])
    assert violations(layer) == []


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    # The same collector over a made-up store module that imports the CLI lazily and analysis
    # through importlib: both must be reported.
    source = (
        "import importlib\n"
        "def f():\n"
        "    from dlprof.cli.main import main\n"
        "    importlib.import_module(f'dlprof.analysis.{x}')\n"
    )
    collector = _Collector("dlprof.store.fake", is_package=False)
    collector.visit(ast.parse(source))
    targets = {(i.target, i.top_level) for i in collector.imports}
    assert targets == {("importlib", True), ("dlprof.cli.main", False), ("dlprof.analysis", False)}
    assert {layer_of(t) for t, _ in targets if t.startswith("dlprof")} <= FORBIDDEN[Layer.STORE]


def test_relative_imports_are_resolved() -> None:
    node = ast.parse("from ..store import reader").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _absolute("dlprof.analysis.pprof", False, node) == "dlprof.store"
    assert _absolute("dlprof.analysis", True, node) == "dlprof.store"


def test_no_framework_is_imported_when_a_module_loads() -> None:
    eager = [
        str(i) for i in ALL_IMPORTS if i.top_level and i.target.split(".")[0] in FRAMEWORKS
    ]
    assert eager == [], "import these inside the functions that use them"


def loaded_after_importing(modules: list[str]) -> tuple[list[str], dict[str, str]]:
    """In a fresh interpreter, import ``modules``; the modules then loaded, and import errors."""
    script = (
        "import importlib, json, sys\n"
        "failed = {}\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:  # reported, not hidden: the test fails on it\n"
        "        failed[name] = f'{type(error).__name__}: {error}'\n"
        "print(json.dumps([sorted(sys.modules), failed]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], check=True, capture_output=True, text=True, timeout=300
    )
    loaded, failed = json.loads(done.stdout)
    return loaded, failed


def test_importing_every_module_loads_no_framework() -> None:
    # The same rule at run time, which also catches a framework pulled in by a dependency.
    modules = [m for m in MODULES if m != "dlprof.__main__"]  # __main__ runs the command line
    loaded, failed = loaded_after_importing(modules)
    assert failed == {}, "these modules do not import"
    assert sorted(FRAMEWORKS & {m.split(".")[0] for m in loaded}) == []


def test_importing_the_store_loads_no_higher_layer() -> None:
    loaded, failed = loaded_after_importing(["dlprof.store.reader"])
    assert failed == {}
    higher = [m for m in loaded if m.startswith("dlprof.") and layer_of(m) in FORBIDDEN[Layer.STORE]]
    assert higher == []
