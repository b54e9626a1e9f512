import sys

from sandbox_conformance.conformance.adapters import main

sys.exit(main())
