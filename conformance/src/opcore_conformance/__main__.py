import sys

from opcore_conformance.cli import main

sys.exit(main())
