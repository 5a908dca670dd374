"""The ``ampcore`` command line (``python -m ampcore``).

* ``main``: the argument parser and sub-commands; ``launch``: set-up before torch imports.
* ``info``, ``oplists``, ``plan``, ``bench``, ``conformance``: one module per sub-command.
* ``experiment``: the AMP guide's experiment that ``ampcore bench`` runs; ``results``: what it
  measured and whether to trust it.
"""

__all__: list[str] = []
