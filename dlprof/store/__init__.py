"""The event store: a run directory of Parquet tables and a manifest (see ARCHITECTURE.md)."""
