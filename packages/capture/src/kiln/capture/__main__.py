"""``python -m kiln.capture SCRIPT.py [args] --out DIR``; see ``_internal/cli.py``."""

from kiln.capture._internal.cli import main

raise SystemExit(main())
