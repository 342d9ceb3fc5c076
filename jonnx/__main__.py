"""``python -m jonnx``: the ``jonnx`` command line (see ``jonnx --help``)."""

import sys

from jonnx.cli import main

sys.exit(main())
