"""`python -m dlrm.cluster`: see `dlrm.cluster.run`."""

import sys

from dlrm.cluster.run import main

sys.exit(main())
