"""Entry point of the dry-run planner's command."""

import sys

from dlrm.plan.cli import main

sys.exit(main())
