"""``python -m sarc``: the ``sarc`` command, as ``python -m sarc.cli`` runs it."""
import sys

from .cli import main

sys.exit(main())
