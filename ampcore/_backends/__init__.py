"""Backends: the plugin manager and what the core asks a backend.

* ``plugins``: :class:`PluginManager`, loading ``ampcore`` entry points through pluggy;
  ``sources``: where a plugin comes from and why it failed.
* ``contract``: the load-time checks of a plugin against ``ampcore.hookspec`` (its contract
  version, hooks that do not exist or were replaced).
* ``backend``: :class:`Backend`, one adapter's answers to the hooks of ``ampcore.hookspec``;
  ``answers``: the checks of what it answers once, at load (its ``BackendSpec``, its op-list
  adjustments); ``checks``: the checks of its other answers (pure functions).
* ``registry``: the process's backends, ``get_backend``/``list_backends``/``register_plugin``.
* ``capability``, ``support``, ``memory``: device questions (dtype support, memory).
"""

__all__: list[str] = []
