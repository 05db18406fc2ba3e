"""python -m acl_swiglu: the sample CLI (same as acl-swiglu-sample)."""

import sys

from .cli import main

sys.exit(main())
