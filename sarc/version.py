"""sarc's version, for what sarc writes (manifests, partition sets) and ``sarc --version``."""
__version__ = "0.1.0"
