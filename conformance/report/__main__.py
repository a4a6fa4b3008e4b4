"""``python -m conformance.report --out DIR``: the suite, the repros and the probes, reported."""

import sys

from conformance.report.write import main

sys.exit(main())
