"""zeromismatch.train: trainer-side logprob recompute and policy-gradient losses."""

from zeromismatch.train.logprobs import compute_logprobs, recompute_outputs  # noqa: F401
from zeromismatch.train.losses import LOSSES, LossOutput, PolicyBatch, compute_loss  # noqa: F401
