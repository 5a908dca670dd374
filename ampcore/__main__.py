"""``python -m ampcore``: the ampcore command line."""

import sys

from ._cli import main

sys.exit(main())
