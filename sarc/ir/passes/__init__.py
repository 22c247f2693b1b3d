"""IR -> IR passes. Each is a pure function ``Function -> Function`` with a name."""
from .cse import cse
from .dce import dce
from .rewrite import Rewriter

__all__ = ["cse", "dce", "Rewriter"]
