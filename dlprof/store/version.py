"""The store's schema version, apart from the schema itself so that reading a manifest needs no
Arrow (``dlprof ls`` and ``dlprof info`` start without it). :mod:`dlprof.store.schema` says what
each version changed; the two must agree (a test checks).
"""

from __future__ import annotations

# 2: slices gained op_type and scope (older runs read with them null).
SCHEMA_VERSION = 2
