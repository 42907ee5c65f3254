import sys

from hpcpar.cli import main

sys.exit(main())
