"""zeromismatch: bitwise-identical rollout and trainer logprobs, and RL on top of them.

Layers (dependencies point downwards only):
kernels -> models -> engine / train -> rl -> experiments (outside the package);
metrics, envs, audit and bisect are leaves used by the layers above them.
"""

__version__ = "0.1.0"
