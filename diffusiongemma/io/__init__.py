"""File-system helpers shared by every command that writes a checkpoint folder."""

from .atomic import CHECKPOINT_PATTERNS, atomic_folder, holds_checkpoint
from .tokenizer_files import TOKENIZER_FILES, folder_has_tokenizer

__all__ = ["CHECKPOINT_PATTERNS", "TOKENIZER_FILES", "atomic_folder", "folder_has_tokenizer", "holds_checkpoint"]
