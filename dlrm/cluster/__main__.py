"""`python -m dlrm.cluster`: see `dlrm.cluster.emulator`."""

import sys

from dlrm.cluster.emulator import main

sys.exit(main())
