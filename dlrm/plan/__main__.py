"""`python -m dlrm.plan`: the dry-run planner's command line."""

import sys

from dlrm.plan.cli import main

sys.exit(main())
