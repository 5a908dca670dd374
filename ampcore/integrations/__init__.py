"""ampcore inside the training frameworks people use; each module imports its framework, so
import only the one you use (the core never imports them).

* :mod:`ampcore.integrations.lightning`: precision plugins for the Lightning ``Trainer``
  (:class:`~ampcore.integrations.lightning.AmpcorePrecision`) and ``Fabric``
  (:class:`~ampcore.integrations.lightning.AmpcoreFabricPrecision`); ``pip install
  ampcore[lightning]``.
* :mod:`ampcore.integrations.accelerate`: :class:`~ampcore.integrations.accelerate.AmpcoreAccelerator`,
  an ``accelerate.Accelerator`` whose ``autocast()`` and scaler are ampcore's;
  ``pip install ampcore[accelerate]``.
* :mod:`ampcore.integrations.transformers`: :class:`~ampcore.integrations.transformers.AmpcoreTrainerMixin`
  and :class:`~ampcore.integrations.transformers.AmpcoreTrainer` for ``transformers.Trainer``;
  ``pip install ampcore[transformers]``.
* :class:`AmpcoreSettings` (framework-free): the settings they all carry.

See docs/integrations.md.
"""

from ._settings import AmpcoreSettings

__all__ = ["AmpcoreSettings"]
