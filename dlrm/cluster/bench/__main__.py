"""`python -m dlrm.cluster.bench`: see `dlrm.cluster.bench.run`."""

import sys

from dlrm.cluster.bench.run import main

sys.exit(main())
