"""Tools on top of the library: the command line (cli, its shared options, the train and sample commands),
bench and its torch references, experiments, figures (evaluation, training curves, schedule drawing, one
style), doctor, the demo, and the report that renders the performance page from stored results (with the
package's layout read from the tree)."""
