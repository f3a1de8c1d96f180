"""Workloads dlprof runs itself to measure a machine: ERT-style kernels (``dlprof calibrate``) and
ParaDnn-style parameterised models (``dlprof sweep``). They use PyTorch, imported inside the
functions that need it, and stand on the core layer only."""
