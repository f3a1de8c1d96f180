"""What the collectors stand on, with no collector in it: perf_event through ctypes, C++
demangling, waiting for a module's import, a sampling thread."""
