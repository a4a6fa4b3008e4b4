import os
import sys

# Test helpers of this package (fsdp_oracle, fsdp_fake, fsdp_world_checks) are imported by name;
# names are unique across the monorepo because pytest runs every package's tests in one process.
sys.path.insert(0, os.path.dirname(__file__))
