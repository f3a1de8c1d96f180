"""Readers of foreign trace formats into the event store's tables, one module per format."""
