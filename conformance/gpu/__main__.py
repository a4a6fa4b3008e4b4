"""``python -m conformance.gpu [pytest arguments]`` (or ``--bench``): the GPU phases."""

import sys

from conformance.gpu.phases import main

raise SystemExit(main(sys.argv[1:]))
