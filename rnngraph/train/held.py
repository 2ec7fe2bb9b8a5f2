"""Ending signals held back while a run's file is written: a Ctrl-C (SIGINT), SIGTERM or SIGHUP that comes
during a checkpoint's write takes effect once the file is complete (an interrupt inside zipfile's writer can
leave it unable to close, a ValueError instead of the interrupt), so the run still ends with its one line."""
from __future__ import annotations

import contextlib
import signal
import threading

HELD = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def signals_held():
    """Within the block, HELD signals are recorded instead of handled; at its end the handlers are restored and
    each signal that came is raised again (its handler then runs: KeyboardInterrupt, or the default action).
    Only the main thread can set handlers: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came, old = [], {}
    for name in HELD:
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) not in (signal.SIG_IGN, None):   # None: not set from Python
            old[sig] = signal.signal(sig, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(came):
            signal.raise_signal(sig)
