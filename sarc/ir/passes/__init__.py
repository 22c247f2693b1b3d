"""IR -> IR passes. Each is a pure function ``Function -> Function`` with a name."""
from .const_fold import const_fold
from .cse import cse
from .dce import dce
from .fuse import fuse
from .fuse_typed import fuse_typed_linear
from .linear_through_aggregate import linear_through_aggregate
from .pushdown import pushdown
from .rewrite import Rewriter
from .split_concat import split_concat
from .twins_first import twins_first

__all__ = ["const_fold", "cse", "dce", "fuse", "fuse_typed_linear", "linear_through_aggregate",
           "pushdown", "split_concat", "twins_first", "Rewriter"]
