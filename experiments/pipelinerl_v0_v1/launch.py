"""Launch pipelinerl_v0_v1: `python experiments/pipelinerl_v0_v1/launch.py --scale mini`.

`--scale smoke` runs seconds; `--scale full --dry-run` writes the published runs' sbatch scripts.

The arms and the published full-scale set-up are in configs.py; the loop, executors and
result layout are shared (zeromismatch.experiment).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from configs import EXPERIMENT  # noqa: E402

from zeromismatch.experiment import launch_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(launch_main(EXPERIMENT))
