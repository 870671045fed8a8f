"""`python -m localspec`: the same command as `localspec` (what a service file runs, by interpreter path)."""

from localspec.cli import main

main()
