"""Log texts the analyzer review's tests share (tests/test_analysis_review.py, its CLI twin)."""

from __future__ import annotations

# An exception's message carrying a child's output: an exit code (a weak signature) before the real error
WRAPPED = """\
Traceback (most recent call last):
  File "/opt/job/run.py", line 40, in <module>
    main()
  File "/opt/job/run.py", line 36, in main
    raise RuntimeError(f"shard writer failed:\\n{err}")
RuntimeError: shard writer failed:
exitcode: -9
mmap of the shared buffer: Cannot allocate memory
"""
