import sys

from sglang_omni.cli import main

sys.exit(main())
