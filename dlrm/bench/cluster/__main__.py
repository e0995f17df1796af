"""Entry point of the cluster experiments' command."""

import sys

from dlrm.bench.cluster.experiments import main

sys.exit(main())
