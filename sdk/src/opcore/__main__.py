import sys

from opcore.cli import main

sys.exit(main())
