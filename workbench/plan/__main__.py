"""`python -m workbench.plan run PLAN OUT_DIR` and `check PLAN...`: the form docs/plans.md
gives, for a GPU box whose copy of the tree is on PYTHONPATH but not installed."""

import sys

from workbench.plan.runner import main

sys.exit(main())
