import sys

from pods_bench.cli import main

sys.exit(main())
