"""Whether a process of this machine still runs (a run's writer, a finisher's claim)."""

from __future__ import annotations


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs. A killed process not yet reaped (a zombie, whose parent was
    killed with it or does not reap) has stopped for good, so it does not; one we may not look
    at does (it exists)."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
