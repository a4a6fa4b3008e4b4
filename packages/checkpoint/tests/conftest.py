import os
import sys

# Test helpers of this package (checkpoint_files, dcp_load_cases, ...) are imported by name,
# also by the spawned rank processes; names are unique across the monorepo because pytest runs
# every package's tests in one process.
sys.path.insert(0, os.path.dirname(__file__))
