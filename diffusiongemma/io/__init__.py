"""File-system helpers shared by every command that writes a checkpoint folder."""

from .atomic import CHECKPOINT_PATTERNS, atomic_folder, holds_checkpoint

__all__ = ["CHECKPOINT_PATTERNS", "atomic_folder", "holds_checkpoint"]
