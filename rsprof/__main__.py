"""`python -m rsprof` is the `rsprof` command."""

import sys

from rsprof.cli import main

sys.exit(main())
