"""`python -m dtrain`: the `dtrain` command."""

from dtrain.cli import main

main()
