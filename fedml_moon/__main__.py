"""`python -m fedml_moon` is the `fedml-moon` command."""

from fedml_moon.cli import entry

entry()
