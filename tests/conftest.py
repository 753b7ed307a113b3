"""The suite runs the pure-Python scheduler: its tests subclass and patch
TOPAS's classes, which compiled classes do not allow. tests/test_native.py
builds the compiled search and checks it decides exactly as the pure one."""

import os

os.environ["TOPASD_NATIVE"] = "0"  # before anything imports topasd.scheduler
