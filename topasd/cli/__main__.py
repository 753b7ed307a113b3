"""`python -m topasd.cli`: the `topasd` command."""

from topasd.cli import main

main()
