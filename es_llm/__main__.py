import sys

from es_llm.cli import main

# The guard matters: reward workers are started with "spawn", which re-imports __main__.
if __name__ == "__main__":
    sys.exit(main())
