import os
import sys

# This package's rank functions (testing_pool_cases) are imported by name, by the ranks too.
sys.path.insert(0, os.path.dirname(__file__))
