"""``python -m feedline.cli``: the ``feedline`` command."""
import sys

from .command import main

sys.exit(main())
