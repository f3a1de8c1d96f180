"""One command that proves every GPU path of dlprof on a machine with a GPU (``make gpu-check``)."""
