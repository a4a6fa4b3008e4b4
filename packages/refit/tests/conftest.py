import os
import sys

# Test helpers of this package (refit_cases) are imported by name, also by the spawned rank
# processes; names are unique across the monorepo.
sys.path.insert(0, os.path.dirname(__file__))
