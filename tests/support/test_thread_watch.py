"""The watch of threads a program starts, on real threads."""

from __future__ import annotations

import threading

from dlprof.support.thread_watch import ThreadWatch


class Unnamed(threading.Thread):
    """A thread of the program's whose name cannot be read yet (its own property raises)."""

    @property  # type: ignore[override]
    def name(self) -> str:
        raise LookupError("named once registered")

    @name.setter
    def name(self, value: str) -> None:
        pass


def test_threads_started_are_named() -> None:
    watch = ThreadWatch()
    thread = threading.Thread(target=lambda: None, name="loader")
    thread.start()
    thread.join()
    watch.close()
    assert watch.names == ["loader"] and watch.failure == ""


def test_a_thread_whose_name_cannot_be_read_runs_and_closes_the_watch() -> None:
    """Before, the watch's LookupError was raised in the thread before its first line ran."""
    ran: list[str] = []
    watch = ThreadWatch()
    thread = Unnamed(target=lambda: ran.append("ran"))
    thread.start()
    thread.join()
    assert ran == ["ran"]
    assert watch.failure == "LookupError: named once registered"
    assert threading.getprofile() is None, "the watch closed itself"
    watch.close()
