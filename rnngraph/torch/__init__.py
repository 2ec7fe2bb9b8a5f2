"""rnngraph from PyTorch: torch.nn.Modules whose forward runs rnngraph's executor and whose backward
runs its BPTT through torch.autograd. Imported only when used (``import rnngraph.torch``); the rest of
rnngraph never imports torch.

    lstm = rnngraph.torch.LSTM(32, 64, num_layers=2)      # the torch.nn.LSTM signature
    y, (h_n, c_n) = lstm(x, (h0, c0))                     # x [T, B, 32] on the CPU or a CUDA device
    rnn = rnngraph.torch.Recurrent("mycells:mgu", 32, 64)  # any cell: built-in, module:function, function
    y_t, state = rnn.step(x_t, state)                      # one frame, x_t [B, 32]
    cell = rnngraph.torch.LSTMCell(32, 64)                 # torch.nn.LSTMCell's signature: h, c = cell(x_t, (h, c))
"""
from .cells import GRUCell, LSTMCell, RNNCell
from .modules import GRU, LSTM, RNN, Recurrent

__all__ = ["Recurrent", "LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell"]
