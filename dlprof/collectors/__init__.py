"""Live sources of events, one module per source; see :mod:`dlprof.collectors.base`."""
