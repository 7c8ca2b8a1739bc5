"""``python -m rabbitflow_broker.cli``: the same as ``rabbitflow-broker``."""

import sys

from rabbitflow_broker.cli.broker import main

sys.exit(main())
