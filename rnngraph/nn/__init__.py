"""Layers with PyTorch's conventions, each with its backward beside its forward: recurrent layers of any
cell (recurrent, stacking, checks), Dense, Softmax, LogSoftmax and Sequential (layers), the losses,
optimisers (optim) and initialisers (init). A whole model reads
``nn.Sequential(nn.LSTM(8, 32), nn.Dense(32, 1))``.
"""
from ..arrays import check_state_dict
from .checks import check_finite
from .layers import Dense, LogSoftmax, Module, Parameterized, Sequential, Softmax
from .losses import CrossEntropyLoss, MSELoss, log_softmax
from .init import init_orthogonal_, init_uniform_
from .recurrent import GRU, LSTM, RNN, Recurrent, detach

__all__ = ["GRU", "LSTM", "RNN", "CrossEntropyLoss", "Dense", "LogSoftmax", "MSELoss", "Module", "Parameterized",
           "Recurrent", "Sequential", "Softmax", "check_finite", "check_state_dict", "detach", "init_orthogonal_",
           "init_uniform_", "log_softmax"]
