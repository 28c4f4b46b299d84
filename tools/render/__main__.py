"""`python -m tools.render`: the command line of tools/render/cli.py."""

import sys

from tools.render.cli import main

if __name__ == "__main__":
    sys.exit(main())
