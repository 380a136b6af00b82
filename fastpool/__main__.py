"""``python -m fastpool``: see fastpool/cli/."""

import sys

from fastpool.cli import main

if __name__ == "__main__":
    sys.exit(main())
