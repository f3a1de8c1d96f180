"""The ``dlprof`` command: one module per subcommand, each defining ``command``."""
