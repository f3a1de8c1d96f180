"""Developer tools run from the source tree (not installed with dlprof)."""
