"""Tools on top of the library: the command line (cli, commands), bench and its PyTorch/JAX references,
experiments, figures and drawing, doctor and the demo."""
