"""``python -m ampcore``: the ampcore command line."""

import sys

from ._cli.main import main

sys.exit(main())
