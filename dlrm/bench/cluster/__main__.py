"""`python -m dlrm.bench.cluster`: the cluster experiments' command line."""

import sys

from dlrm.bench.cluster.experiments import main

sys.exit(main())
