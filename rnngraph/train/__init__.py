"""Training a character-level model: the text and its streams (data), the model (charlm), the loop (loop),
checkpoints, run identity (runs) and sampling."""

from .loop import TrainConfig, Trainer, read_log, train
from .sample import generate, load_model

__all__ = ["TrainConfig", "Trainer", "generate", "load_model", "read_log", "train"]
