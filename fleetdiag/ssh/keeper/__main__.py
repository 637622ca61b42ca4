"""``python -m fleetdiag.ssh.keeper DIR PERSIST``: a keeper started by hand."""

import sys

from .start import detach_main

sys.exit(detach_main(sys.argv[1:]))
