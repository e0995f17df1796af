import sys

from dlrm.predict.cli import main

sys.exit(main())
