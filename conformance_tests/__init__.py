"""ampcore's vendor conformance suite (installed as ``ampcore_conformance``).

Run it against an installed backend with ``ampcore conformance --backend NAME`` or, through
plain pytest, ``pytest -p ampcore_conformance.plugin --pyargs ampcore_conformance
--ampcore-backend NAME``.  docs/conformance.md describes options, manifests and reports.

Keep this module free of imports: pytest may import the package under a second name.
"""

from typing import Final

__all__ = ["SUITE_VERSION"]

#: Version of the checks themselves (recorded in every report beside ampcore's version).
SUITE_VERSION: Final = "1.0.0"
