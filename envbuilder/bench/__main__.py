from __future__ import annotations

import sys

from envbuilder.bench import main

sys.exit(main())
