"""`python -m dlrm.plan`: see `dlrm.plan`."""

import sys

from dlrm.plan.cli import main

sys.exit(main())
