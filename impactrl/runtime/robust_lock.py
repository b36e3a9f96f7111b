"""A lock shared by processes that a killed holder cannot leave locked, and that nobody else ever
releases: a process-shared, robust POSIX mutex (``pthread_mutexattr_setrobust``) in shared memory.

When its holder dies, the kernel marks it, and the next process to take it gets it with
``EOWNERDEAD``, makes it consistent and goes on. A holder that lives, however long it is stopped,
keeps it: no timeout hands its lock to another process, so no process ever finds its own lock
released under it. Taking and giving it order memory like any mutex (acquire and release).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import time

# Room for a pthread_mutex_t (40 bytes on x86-64 glibc, 48 on arm64) and a pthread_mutexattr_t.
MUTEX_BYTES = 64
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_CLOCK_REALTIME = 0  # pthread_mutex_timedlock's deadlines are on this clock


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class RobustLock:
    """``acquire(timeout)`` and ``release()`` of a robust, process-shared mutex made in ``ctx``'s
    shared memory; pass it to a process when it is started, like a multiprocessing lock."""

    def __init__(self, ctx):
        self._mutex = ctx.RawArray(ctypes.c_char, MUTEX_BYTES)
        attributes = ctypes.create_string_buffer(MUTEX_BYTES)
        for call, args in (("pthread_mutexattr_init", ()), ("pthread_mutexattr_setpshared", (1,)),
                           ("pthread_mutexattr_setrobust", (1,))):
            _check(getattr(_libc, call)(attributes, *args), call)
        _check(_libc.pthread_mutex_init(self._mutex, attributes), "pthread_mutex_init")
        _libc.pthread_mutexattr_destroy(attributes)

    def acquire(self, timeout: float) -> bool:
        """Take the lock within ``timeout`` seconds (False if not); one whose holder died is taken over."""
        now = time.clock_gettime(_CLOCK_REALTIME) + timeout
        deadline = _Timespec(int(now), int((now % 1) * 1e9))
        code = _libc.pthread_mutex_timedlock(self._mutex, ctypes.byref(deadline))
        if code == errno.EOWNERDEAD:
            _check(_libc.pthread_mutex_consistent(self._mutex), "pthread_mutex_consistent")
            return True
        if code == errno.ETIMEDOUT:
            return False
        _check(code, "pthread_mutex_timedlock")
        return True

    def release(self) -> None:
        _check(_libc.pthread_mutex_unlock(self._mutex), "pthread_mutex_unlock")


def _check(code: int, call: str) -> None:
    if code:
        raise OSError(code, f"{call}: {errno.errorcode.get(code, code)}")
