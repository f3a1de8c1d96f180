"""The store's schema version, apart from the schema itself so that reading a manifest needs no
Arrow (``dlprof ls`` and ``dlprof info`` start without it). :mod:`dlprof.store.schema` says what
each version changed; the two must agree (a test checks).
"""

from __future__ import annotations

# 2: slices gained op_type and scope (older runs read with them null).
# 3: a rank's rows lie in one part file per save (part-NNNNN.parquet), beside the chunks no part
#    holds yet (a reader of version 2 would read the first save only).
SCHEMA_VERSION = 3
