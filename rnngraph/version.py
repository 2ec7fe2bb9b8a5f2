"""The package version (setup.cfg reads it from rnngraph.__version__)."""
__version__ = "0.1.0"
