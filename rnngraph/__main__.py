"""`python -m rnngraph`: the same command line as the `rnngraph` console script."""
from .lab.cli import main

raise SystemExit(main())
