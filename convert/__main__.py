"""`python -m convert`: see `convert.cli`."""

from .cli import main

raise SystemExit(main())
