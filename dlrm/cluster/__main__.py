"""Entry point of the emulated cluster's command."""

import sys

from dlrm.cluster.emulator import main

sys.exit(main())
