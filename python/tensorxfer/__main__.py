"""``python -m tensorxfer info | demo | bench``: see :mod:`tensorxfer.cli`."""

import sys

from tensorxfer.cli import main

sys.exit(main())
