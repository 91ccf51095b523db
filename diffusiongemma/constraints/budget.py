"""Compiling a constraint within a time and memory budget: the work runs in a forked child process.

outlines-core can take minutes and gigabytes on a small schema (a top-level `{"type": "string", "maxLength": 20}`
took 104 s and 4.4 GB: the string's character class repeated 20 times becomes a huge byte automaton) and cannot be
interrupted from Python. A thread could not be stopped, nor its memory bounded; a child process can: it gets an
address-space limit (`RLIMIT_AS`: its size at the fork plus the budget), so an allocation beyond the budget fails
inside it (Rust aborts, Python raises `MemoryError`), and it is killed when its time is up. Either way the caller
gets a `ConstraintError` naming the budget. The child is forked, so it starts in milliseconds with the tokenizer's
spelling already in memory, and only the result crosses the pipe (pickled).

Where `os.fork` or `/proc/self/status` is missing (not Linux), the work runs in the caller's process without a
budget.
"""

import faulthandler
import os
import pickle
import resource
import select
import signal
import time
from dataclasses import dataclass

from .errors import ConstraintError

GIB = 1 << 30


@dataclass(frozen=True)
class CompileBudget:
    """The most one constraint's compilation may take.

    Args:
        seconds: wall-clock seconds (the child is killed after them).
        memory_bytes: bytes of address space the child may add to what it inherited (its allocations fail beyond).
    """

    seconds: float = 60.0
    memory_bytes: int = 4 * GIB

    def __post_init__(self):
        if not self.seconds > 0:
            raise ValueError(f"CompileBudget: `seconds` must be > 0, got {self.seconds!r}")
        if not (isinstance(self.memory_bytes, int) and self.memory_bytes > 0):
            raise ValueError(f"CompileBudget: `memory_bytes` must be a positive int, got {self.memory_bytes!r}")

    def describe(self) -> str:
        return f"{self.seconds:g} s and {self.memory_bytes / GIB:.3g} GiB"


DEFAULT_BUDGET = CompileBudget()


def address_space_bytes() -> int | None:
    """This process' virtual memory size (VmSize), or None where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def child_main(fn, budget: CompileBudget, write_fd: int) -> None:
    """In the forked child: limit the address space, run `fn`, send back ("ok", result) or ("error", exception)."""
    try:
        # a pipe another thread opened for its own child may be in this copy (forked between its `pipe` and its
        # `close`): close everything but ours, so that sibling's reader is never kept waiting for our exit
        os.closerange(3, write_fd)
        os.closerange(write_fd + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        faulthandler.disable()  # an abort here is expected and reported by the parent
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)  # Rust's "memory allocation failed" line: the parent's message says it instead
        limit = address_space_bytes() + budget.memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            outcome = ("ok", fn())
        except MemoryError:
            outcome = ("memory", None)
        except Exception as error:  # noqa: BLE001 - handed to the parent, which raises it
            outcome = ("error", error if isinstance(error, ConstraintError) else ConstraintError(repr(error)))
        payload = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(0)


def read_until(fd: int, pid: int, deadline: float) -> bytes | None:
    """Everything the child writes to `fd` until it closes it, or None once `deadline` passes (the child killed)."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            os.kill(pid, signal.SIGKILL)
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_within_budget(fn, budget: CompileBudget, description: str):
    """`fn()` computed in a forked child within `budget` (in this process where fork is unavailable).

    Raises:
        ConstraintError: `fn` raised it, ran past `budget.seconds`, or needed more than `budget.memory_bytes`.
    """
    if not hasattr(os, "fork") or address_space_bytes() is None:
        return fn()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read_fd)
        child_main(fn, budget, write_fd)
    os.close(write_fd)
    try:
        payload = read_until(read_fd, pid, time.monotonic() + budget.seconds)
    finally:
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
    refused = (f"{description}: compiling it exceeds the budget of {budget.describe()} (a long string with "
               f"minLength/maxLength at the top level is the usual cause; simplify the constraint or raise the budget)")
    if payload is None:
        raise ConstraintError(f"{refused}: still running after {budget.seconds:g} s")
    if not payload:  # the child died before writing: Rust aborts when an allocation fails
        cause = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        raise ConstraintError(f"{refused}: out of memory (the compiler died: {cause})")
    kind, value = pickle.loads(payload)
    if kind == "memory":
        raise ConstraintError(f"{refused}: out of memory")
    if kind == "error":
        raise value
    return value
