"""Deprecated path of :mod:`chaos.targets.reference.trainer`, kept because 0.1 scenarios name it in a torchrun
target's ``module:``. ``python -m chaos.targets.ddp_trainer`` runs the reference trainer with a
DeprecationWarning; the path goes in 0.3."""

import runpy
import warnings

if __name__ == "__main__":
    warnings.warn(
        "chaos.targets.ddp_trainer moved to chaos.targets.reference.trainer in mlchaos 0.2; the old path goes in 0.3",
        DeprecationWarning,
        stacklevel=1,
    )
    runpy.run_module("chaos.targets.reference.trainer", run_name="__main__", alter_sys=True)
else:
    from chaos import moved_to

    warnings.warn(f"{__name__} moved to {moved_to(__name__)} in mlchaos 0.2", DeprecationWarning, stacklevel=2)
    from chaos.targets.reference.trainer import *  # noqa: F403 - the old module's names, for one release
