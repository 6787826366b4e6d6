"""``python -m experiments.costmodel COMMAND``: see ``cli.py``."""
import sys

from .cli import main

sys.exit(main())
