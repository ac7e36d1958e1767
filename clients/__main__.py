"""`python -m clients --help`"""
import sys

from .cli import main

sys.exit(main())
