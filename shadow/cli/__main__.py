"""`python -m shadow.cli`: the same commands as the `shadow` script."""

from shadow.cli import main

main()
