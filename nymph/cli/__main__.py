"""``python -m nymph.cli``: the ``nymph`` command."""

import sys

from nymph.cli import main

sys.exit(main())
