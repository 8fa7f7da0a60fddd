import sys

from picklescope.cli import main

sys.exit(main())
