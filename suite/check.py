"""``python -m suite.check package.module:factory [--strategies ...] [--steps K]``: check a
training loop under each strategy spec against itself with no strategy (pytest side, no
TensorFlow; the work is in suite/harness/loopcheck/usercheck.py)."""

import sys

from .harness.loopcheck.usercheck import main

if __name__ == "__main__":
    sys.exit(main())
