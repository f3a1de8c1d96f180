"""Pure functions over a loaded run: ``Run -> DataFrame``; no printing, no file I/O."""
