"""A real Spark in local mode for the engine tests (PySpark from the ``spark`` extra, Java 17)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

# Local mode with two workers and few shuffle partitions: the runs here are small, and Spark's
# default of 200 partitions would spend the tests' time scheduling empty tasks.
SPARK_ARGS = "--master local[2] --conf spark.sql.shuffle.partitions=4 pyspark-shell"


def spark_unavailable() -> str | None:
    """Why Spark cannot run here, or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "needs PySpark: pip install 'dlprof[spark]' (make test installs it)"
    java = shutil.which("java")
    if java is None:
        return "needs Java 17 (Debian: openjdk-17-jre-headless; make test installs it)"
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        return f"java -version failed: {done.stderr.strip()[:200]}"
    return None


@pytest.fixture(scope="session")
def spark() -> None:
    """Spark's settings for the test session, or a skip saying why Spark cannot run."""
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", SPARK_ARGS)
