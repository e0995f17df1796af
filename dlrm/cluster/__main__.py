"""`python -m dlrm.cluster`: the emulated cluster's command line."""

import sys

from dlrm.cluster.emulator import main

sys.exit(main())
