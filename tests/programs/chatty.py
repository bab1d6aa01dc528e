"""A test program for the launcher: prints lines, maybe starts a grandchild, ignores SIGTERM on request.

python chatty.py [--ready-after S] [--exit-code N] [--grandchild] [--ignore-term] [--lines N]
"""

import argparse
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--lines", type=int, default=3)
parser.add_argument("--ready-after", type=float, default=None, help="print READY after this many seconds")
parser.add_argument("--exit-code", type=int, default=None, help="exit with this code after the lines")
parser.add_argument("--grandchild", action="store_true", help="start a `sleep` that also ignores SIGTERM")
parser.add_argument("--ignore-term", action="store_true")
parser.add_argument("--stderr", action="store_true", help="print the lines on stderr")
args = parser.parse_args()

if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.grandchild:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('armed', flush=True); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child.stdout.readline()  # its SIGTERM handler is set
    print(f"grandchild {child.pid}", flush=True)
out = sys.stderr if args.stderr else sys.stdout
for i in range(args.lines):
    print(f"line {i}", file=out, flush=True)
if args.exit_code is not None:
    sys.exit(args.exit_code)
if args.ready_after is not None:
    time.sleep(args.ready_after)
    print("READY chatty url=http://127.0.0.1:1/ instance=abc123", flush=True)
while True:
    time.sleep(1)
