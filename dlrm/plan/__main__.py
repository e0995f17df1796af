"""`python -m dlrm.plan`: see `dlrm.plan`."""

import sys

from dlrm.plan import main

sys.exit(main())
