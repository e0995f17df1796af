import sys

from dlrm.data.inspect.cli import main

sys.exit(main())
