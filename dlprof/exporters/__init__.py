"""Exporters: a loaded run written out in another tool's format, one format per module.

Each exporter is a subclass of :class:`dlprof.exporters.base.Exporter`; the registry
(:mod:`dlprof.exporters.registry`) finds them by format name or file extension::

    from dlprof.exporters.registry import exporter_for_format
    exporter_for_format("perfetto")().export(dlprof.load("runs/cnn"), Path("cnn.perfetto-trace"))
"""
