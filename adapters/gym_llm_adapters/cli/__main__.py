import sys

from gym_llm_adapters.cli import main

sys.exit(main())
