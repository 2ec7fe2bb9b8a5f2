"""Tools on top of the library: the command line (cli, its shared options, the train and sample commands),
bench and its torch references, experiments, figures (evaluation, training curves, schedule drawing, one
style), doctor and the demo."""
