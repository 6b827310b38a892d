"""mlchaos: fault injection and chaos testing for distributed ML training and serving.

The engine lives in this package; fault families live in the sibling ``injectors`` package. Data flows one way:
``spec`` -> ``plan`` -> ``run`` -> ``history`` -> ``checks`` -> ``report`` (see ``docs/architecture.md``).
At top level live only the modules users import in their own code: :mod:`chaos.agent`, :mod:`chaos.events`
and :mod:`chaos.strategies`.
"""

__version__ = "0.2.0"
