"""Partition sets are written through ``sarc.atomic``, as every set sarc writes; the
names are kept here for code that imports them from ``sarc.partition``."""
from ..atomic import DirectoryExistsError, atomic_directory, check_target  # noqa: F401
