import sys

from dds.cli import main

sys.exit(main())
