"""rnngraph.losses: the losses of rnngraph.nn.losses, each with its backward."""
from .nn.losses import CrossEntropyLoss, MSELoss, log_softmax

__all__ = ["CrossEntropyLoss", "MSELoss", "log_softmax"]
