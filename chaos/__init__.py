"""mlchaos: fault injection and chaos testing for distributed ML training and serving.

The engine lives in this package; fault families live in the sibling ``injectors`` package.
Data flows one way: scenario -> plan -> runner -> history -> checks -> report.
"""

__version__ = "0.1.0"
