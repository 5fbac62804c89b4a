"""``python -m torchssvm``: the command line (`torchssvm.cli`), as the ``torchssvm`` entry point."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
