"""The recording path: a profiling session and everything that runs beside the profiled program.

A :class:`~dlprof.recording.session.Session` owns one rank of one run: it starts the collectors
(:mod:`.collector_set`), keeps the steps and regions (:mod:`.regions`), decides when to save
(:mod:`.save_policy`), writes each save (:mod:`.saves`) and hands it to the finisher child
(:mod:`.finisher`), follows forked children (:mod:`.forks`), and runs a script or module inside
itself for ``dlprof run`` (:mod:`.runner`, :mod:`.launcher` for ``--nproc``). Nothing here reads a
run back; the records a save leaves on disk belong to the store (:mod:`dlprof.store.save_jobs`).
"""
