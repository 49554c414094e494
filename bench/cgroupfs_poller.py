#!/usr/bin/python3
"""Peer for `cargo xtask bench`: a cgroupfs poller in the manner of cAdvisor.

Every --interval seconds it walks every cgroup under the cgroup2 mount, reads each one's
cpu.stat, and prints one JSON line per sample:

  {"t": <CLOCK_MONOTONIC seconds>, "usage_usec": {"/path": usec, ...}}

Only cgroups whose path starts with --report-prefix are printed (all are read, as cAdvisor
reads them all; printing all would measure JSON output rather than polling). It stops on
SIGTERM or SIGINT.
"""

import argparse
import json
import os
import signal
import sys
import time


def read_usage(path):
    try:
        with open(os.path.join(path, "cpu.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value)
    except OSError:
        return None  # removed while we walked, or no cpu controller file
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mount", required=True, help="the cgroup2 mount point")
    parser.add_argument("--report-prefix", default="/")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()

    running = [True]

    def stop(_signum, _frame):
        running[0] = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    next_tick = time.monotonic()
    while running[0]:
        report = {}
        for dirpath, _dirnames, _files in os.walk(args.mount):
            usage = read_usage(dirpath)
            rel = "/" + os.path.relpath(dirpath, args.mount).lstrip(".")
            if usage is not None and rel.startswith(args.report_prefix):
                report[rel] = usage
        sys.stdout.write(json.dumps({"t": time.monotonic(), "usage_usec": report}) + "\n")
        sys.stdout.flush()
        next_tick += args.interval
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_tick = time.monotonic()


if __name__ == "__main__":
    main()
