"""`python -m fedml_moon` is the `fedml-moon` command."""

import sys

from fedml_moon.cli import main

sys.exit(main())
