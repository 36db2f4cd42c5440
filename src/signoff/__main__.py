"""`python -m signoff`: the same command line as `signoff`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
