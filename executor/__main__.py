import sys

from executor.cli.commands import main

sys.exit(main())
