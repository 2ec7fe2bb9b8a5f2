"""rnngraph.layers: the layers of rnngraph.nn.layers (Dense, Softmax, LogSoftmax, Sequential; the losses too)."""
from .nn.layers import (CrossEntropyLoss, Dense, LogSoftmax, MSELoss, Module, Parameterized, Sequential, Softmax,
                        check_state_dict, log_softmax)

__all__ = ["CrossEntropyLoss", "Dense", "LogSoftmax", "MSELoss", "Module", "Parameterized", "Sequential",
           "Softmax", "check_state_dict", "log_softmax"]
