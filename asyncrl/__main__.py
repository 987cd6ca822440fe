"""`python -m asyncrl ...`: the `asyncrl` command (`asyncrl.tools.entry`)."""

import sys

from asyncrl.tools.entry import main

sys.exit(main())
