"""A wake-up through a pipe, between two threads: ``ring`` and ``wait`` are system calls made without the GIL,
where a ``Condition`` (or a ``Future``'s ``result()``) wakes the waiting thread from inside a call that holds it:
on a virtual machine, where waking a thread on another core is slow, the GIL then stays held for the whole
wake-up. A ring that finds the pipe full is not needed: a wake-up is already pending. A ring stays pending
until a wait reads it, so a wait may return for a ring made before it (the waiter looks again)."""
from __future__ import annotations

import os
import select


class WakePipe:
    def __init__(self):
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._closed = False

    def ring(self) -> None:
        try:
            os.write(self._write, b"\0")
        except (BlockingIOError, OSError):  # full (a wake-up is pending), or closed
            pass

    def wait(self, timeout: float | None = None) -> None:
        """Until a ring since the last wait (or before it, unread), or ``timeout`` seconds (None: no limit)."""
        ready, _, _ = select.select([self._read], [], [], timeout)
        if ready:
            os.read(self._read, 4096)

    def close(self) -> None:
        """(Once neither thread uses it any more.)"""
        if not self._closed:
            self._closed = True
            for fd in (self._read, self._write):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __del__(self):
        self.close()
