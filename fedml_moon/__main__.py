"""`python -m fedml_moon` is the `fedml-moon` command."""

import sys

from fedml_moon.cli import main

code = main()
group = sys.modules.get("fedml_moon.distributed.silo_group")  # loaded only where a silo ran as a group
if group is not None:
    group.exit_if_left(code)
sys.exit(code)
