import sys

from fastpipe._cli import main

if __name__ == "__main__":
    sys.exit(main())
