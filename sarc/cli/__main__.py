"""``python -m sarc.cli``: the ``sarc`` command."""
import sys

from . import main

sys.exit(main())
