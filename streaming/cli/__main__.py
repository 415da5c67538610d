"""``python -m streaming.cli``: the same as the ``compacted-sink`` console script."""

import sys

from streaming.cli import main

sys.exit(main())
