"""The test suite's own layering, read from its source with ``ast``.

Test modules share helpers through ``tests/builders.py`` (runs built from rows, traces and
counters), ``tests/references.py`` (expected values worked out without dlprof) and the other
plain helper modules, and fixtures through conftest files. A test module that imports another
test module runs that module's import-time work and drags its fixtures' names along, and the
helpers it takes are hard to find; a package's conftest imported by name is the same thing.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT_CONFTEST = "tests.conftest"


def module_name(path: Path) -> str:
    """``tests/analysis/test_gpu.py`` → ``tests.analysis.test_gpu``."""
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, importer: str) -> list[tuple[int, str]]:
    """Every module an import statement names (at any depth, inside functions too), as
    (line, absolute name); ``from a import b`` also names ``a.b``, which may be a module."""
    found: list[tuple[int, str]] = []
    package = importer.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return sorted(found)


def forbidden(module: str) -> bool:
    """A test module, or a conftest other than the root one."""
    if not module.startswith("tests."):
        return False
    last = module.rsplit(".", 1)[-1]
    return last.startswith("test_") or (last == "conftest" and module != ROOT_CONFTEST)


def layering_errors(source: str, importer: str) -> list[str]:
    return [f"{importer}:{line} imports {module}" for line, module in imported_modules(source, importer)
            if forbidden(module)]


def test_no_module_of_the_suite_imports_a_test_module_or_a_package_conftest() -> None:
    errors = [error for path in sorted(TESTS.rglob("*.py"))
              for error in layering_errors(path.read_text(), module_name(path))]
    assert errors == []


def test_the_check_finds_such_imports() -> None:
    source = (
        "from tests.analysis.test_gpu import reference\n"
        "import tests.store.test_store\n"
        "def later():\n"
        "    from tests.exporters.conftest import write_imported_run\n"
        "from . import test_diff\n"
        "from .test_tfprof import Walk\n"
        "from tests import builders\n"
        "from tests.conftest import KINETO_TRACES\n"
    )
    assert layering_errors(source, "tests.cli.test_x") == [
        "tests.cli.test_x:1 imports tests.analysis.test_gpu",
        "tests.cli.test_x:2 imports tests.store.test_store",
        "tests.cli.test_x:4 imports tests.exporters.conftest",
        "tests.cli.test_x:5 imports tests.cli.test_diff",
        "tests.cli.test_x:6 imports tests.cli.test_tfprof",
    ]
