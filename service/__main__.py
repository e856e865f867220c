"""``python -m service`` is the ``memoria`` command."""

import sys

from service.cli import main

sys.exit(main())
