"""The markers ``tests/conftest.py`` adds from the fixtures a test asks for, checked on tests
collected by pytester (no fixture is built) and against the markers pyproject.toml declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_MARKERS, markers_for

# A suite of its own: the real hook, and stand-ins for the fixtures that would take minutes.
CONFTEST = '''
import pytest
from tests.conftest import pytest_collection_modifyitems  # noqa: F401

@pytest.fixture
def two_rank_gloo_run():
    raise AssertionError("collecting must not build the fixture")

@pytest.fixture
def tf_profile():
    raise AssertionError("collecting must not build the fixture")

@pytest.fixture
def derived(tf_profile):
    return tf_profile
'''

TESTS = '''
import pytest

def test_gloo(two_rank_gloo_run):
    pass

def test_through_another_fixture(derived):
    pass

@pytest.mark.slow
def test_marked_already(two_rank_gloo_run):
    pass

def test_plain(tmp_path):
    pass
'''


def test_a_test_asking_for_the_gloo_job_is_marked_torch_and_slow(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n    torch: torch\n    tf: tf\n")
    pytester.makepyfile(test_marked=TESTS)
    collected, _ = pytester.inline_genitems()
    items = {item.name: item for item in collected}
    markers = {name: sorted(m.name for m in item.iter_markers()) for name, item in items.items()}
    assert markers == {
        "test_gloo": ["slow", "torch"],
        "test_through_another_fixture": ["tf"],
        "test_marked_already": ["slow", "torch"],
        "test_plain": [],
    }


def test_markers_come_from_every_fixture_asked_for() -> None:
    assert markers_for(["tmp_path", "cnn_run"]) == {"torch"}
    assert markers_for(["cnn_run", "keras_run", "two_rank_gloo_run"]) == {"torch", "tf", "slow"}
    assert markers_for([]) == set()


def test_every_marker_in_the_table_is_declared(pytestconfig: pytest.Config) -> None:
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {m for markers in FIXTURE_MARKERS.values() for m in markers} <= declared


def fixture_names() -> set[str]:
    """Every function of the suite decorated with ``@pytest.fixture`` (called or not)."""
    found = set()
    for path in Path(__file__).resolve().parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                "pytest.fixture" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
                for d in node.decorator_list
            ):
                found.add(node.name)
    return found


def test_the_table_names_fixtures_that_exist() -> None:
    assert set(FIXTURE_MARKERS) - fixture_names() == set()
