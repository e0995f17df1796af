import sys

from dlrm.export.cli import main

sys.exit(main())
