"""Stand-in for GNU time when /usr/bin/time is missing: run a command, write "%M %U %S".

    python -S _rusage.py OUTFILE COMMAND [ARG ...]

Peak RSS (KB) is that of the largest process of the command's tree; it
includes up to this small interpreter's own size (~10 MB), inherited at fork.
"""

import subprocess
import sys

out, argv = sys.argv[1], sys.argv[2:]
rc = subprocess.call(argv)
ru = __import__("resource").getrusage(__import__("resource").RUSAGE_CHILDREN)
with open(out, "w") as fh:
    fh.write(f"{ru.ru_maxrss} {ru.ru_utime:.2f} {ru.ru_stime:.2f}\n")
sys.exit(rc if rc >= 0 else 128 - rc)
