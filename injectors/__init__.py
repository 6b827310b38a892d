"""Built-in fault families, one module or folder each (process, network, storage, node, container, tensor, gradient).

A module lists its injector classes in a module-level ``INJECTORS`` tuple, which :mod:`chaos.plugins.registry`
reads; third parties register theirs under the ``mlchaos.injectors`` entry-point group instead. Every
injector follows :class:`chaos.plugins.injector.Injector`: ``prepare`` changes nothing and returns everything heal
needs, ``heal`` is idempotent and safe after a crash, and anything that must outlive the harness (a duty
cycle) runs as a detached helper that ends by itself and always leaves the target as it found it.
"""
