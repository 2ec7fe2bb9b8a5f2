"""The package version: setup.cfg reads it here, and rnngraph.__version__ re-exports it."""
__version__ = "0.1.0"
