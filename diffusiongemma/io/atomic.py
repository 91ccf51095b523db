"""`atomic_folder`: write a checkpoint folder so that readers only ever see the complete old or the complete new one.

Every writer (`save_pretrained`, `quantize`, training checkpoints) writes into a temporary sibling of the destination
(`.NAME.tmp-PID-XXXX`, same parent, so the same file system) and, only once everything is written, swaps it into
place. With `overwrite`, what the previous checkpoint held (weights, shards, index, configs, trainer state) is gone
after the swap: nothing stale can win on the next load. Other entries of the old folder (a tokenizer, logs, a
sub-folder) are kept, hard-linked into the new folder before the swap.

Interruptions: an exception or KeyboardInterrupt (Ctrl-C, SIGINT) while writing removes the temporary folder and
leaves the destination untouched. The swap itself is one `renameat2(RENAME_EXCHANGE)` system call on Linux; elsewhere
two renames run with SIGINT held back until both are done. A process killed outright (SIGKILL, power loss) may leave
a `.NAME.tmp-*` sibling, never a half-written destination; the next write removes such leftovers of dead processes.
"""

import contextlib
import ctypes
import errno
import fnmatch
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["CHECKPOINT_PATTERNS", "atomic_folder", "holds_checkpoint"]

# What a checkpoint consists of: replaced as a whole by the next write, never carried over.
CHECKPOINT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.pt",
                       "config.json", "generation_config.json", "recipe.yaml")


def is_checkpoint_file(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in CHECKPOINT_PATTERNS)


def holds_checkpoint(folder: Path) -> bool:
    """Whether `folder` holds any checkpoint file (weights, index, config)."""
    return folder.is_dir() and any(is_checkpoint_file(entry.name) for entry in folder.iterdir())


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux `renameat2(RENAME_EXCHANGE)`); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Defer SIGINT (main thread only) until the block is done, then deliver it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(*received[0])


def _swap_into_place(new: Path, destination: Path) -> Path | None:
    """Put `new` at `destination`; returns where the old folder went (to be removed), or None if there was none."""
    if not destination.exists():
        os.rename(new, destination)
        return None
    if _exchange(new, destination):
        return new  # `new` now names the old folder
    old = destination.with_name(f".{destination.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with _sigint_held():
        os.rename(destination, old)
        os.rename(new, destination)
    return old


def _link_tree(src: Path, dst: Path) -> None:
    """Hard-link (copy where linking fails) a kept entry of the old folder into the new one."""
    def link(a, b):
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_dir() and not src.is_symlink():
        shutil.copytree(src, dst, symlinks=True, copy_function=link)
    elif src.is_symlink():
        os.symlink(os.readlink(src), dst)
    else:
        link(src, dst)


def _remove_dead_leftovers(destination: Path) -> None:
    """Remove `.NAME.tmp-PID-*` / `.NAME.old-PID-*` siblings whose writing process no longer runs."""
    for prefix in (f".{destination.name}.tmp-", f".{destination.name}.old-"):
        for entry in destination.parent.glob(prefix + "*"):
            pid = entry.name[len(prefix):].split("-")[0]
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(entry, ignore_errors=True)
            except PermissionError:
                pass


@contextlib.contextmanager
def atomic_folder(destination, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder to write a checkpoint into; on success it replaces `destination`.

    Args:
        destination: the checkpoint folder to (re)write; its parents are created.
        overwrite: replace a destination that already holds a checkpoint. Without it, such a destination is refused
            before anything is written.

    Raises:
        NotADirectoryError: `destination` is a file. FileExistsError: it holds a checkpoint and `overwrite` is False.
    """
    destination = Path(destination).absolute()
    if destination.exists() and not destination.is_dir():
        raise NotADirectoryError(f"{destination} is a file, not a folder: cannot write a checkpoint there")
    if not overwrite and holds_checkpoint(destination):
        raise FileExistsError(f"{destination} already holds a checkpoint: pass overwrite=True (--overwrite) to "
                              "replace it, or choose another folder")
    destination.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_leftovers(destination)
    work = destination.with_name(f".{destination.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    work.mkdir()
    try:
        yield work
        if destination.is_dir():  # keep what is not part of the old checkpoint (tokenizer, logs, sub-folders)
            for entry in destination.iterdir():
                if not is_checkpoint_file(entry.name) and not (work / entry.name).exists() \
                        and not entry.name.startswith(f".{destination.name}."):
                    _link_tree(entry, work / entry.name)
        old = _swap_into_place(work, destination)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
