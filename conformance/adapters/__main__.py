import sys

from conformance.adapters import main

sys.exit(main())
