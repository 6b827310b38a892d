"""The check contract, where check authors import it: ``register_check``, ``CheckResult`` and friends.

Defined in :mod:`chaos.plugins.check` (below the spec in the layering); this module is its stable address.
"""

from chaos.plugins.check import CHECKS, CheckFn, CheckParams, CheckResult, CheckSpec, Status, register_check

__all__ = ["CHECKS", "CheckFn", "CheckParams", "CheckResult", "CheckSpec", "Status", "register_check"]
