"""``zeromismatch.expt`` is ``zeromismatch.experiment`` (experiment specs, the launcher, the
learnability suite) under its old name: this alias keeps it and its submodules importable."""

import sys

from ..experiment import *  # noqa: F403
from ..experiment import __all__, learnability, runner, spec  # noqa: F401

for _name, _module in (("learnability", learnability), ("runner", runner), ("spec", spec)):
    sys.modules[f"{__name__}.{_name}"] = _module
