"""`python -m dlrm.bench.cluster`: see `dlrm.bench.cluster.experiments`."""

import sys

from dlrm.bench.cluster.experiments import main

sys.exit(main())
