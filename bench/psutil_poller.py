#!/usr/bin/python3
"""Peer for `cargo xtask bench`: a psutil poller in the manner of Lithops' SystemMonitor.

Every --interval seconds it samples the CPU times of the worker's processes (the pids in
the worker cgroup's cgroup.procs; Lithops watches its own process the same way) and the
host-wide network counters (Lithops reports psutil.net_io_counters(), host-wide), and
prints one JSON line per sample:

  {"t": <CLOCK_MONOTONIC seconds>, "cpu": {"<pid>": user+system seconds, ...},
   "net_sent": bytes, "net_recv": bytes}

It stops on SIGTERM or SIGINT. Run with Debian's /usr/bin/python3 (python3-psutil).
"""

import argparse
import json
import os
import signal
import sys
import time

import psutil


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cgroup-parent", required=True,
                        help="cgroup directory whose children (one level) are the workers")
    parser.add_argument("--prefix", default="", help="only child cgroups with this name prefix")
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()

    running = [True]

    def stop(_signum, _frame):
        running[0] = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


    procs = {}  # pid -> psutil.Process, kept so psutil caches what it can (as Lithops does)
    next_tick = time.monotonic()
    while running[0]:
        pids = set()
        try:
            for name in os.listdir(args.cgroup_parent):
                if not name.startswith(args.prefix):
                    continue
                path = os.path.join(args.cgroup_parent, name, "cgroup.procs")
                try:
                    with open(path) as f:
                        pids.update(int(line) for line in f if line.strip())
                except OSError:
                    pass  # the cgroup went away between listdir and open
        except OSError:
            pass
        cpu = {}
        for pid in pids:
            proc = procs.get(pid)
            if proc is None:
                try:
                    proc = procs[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            try:
                times = proc.cpu_times()
                cpu[str(pid)] = times.user + times.system
            except psutil.Error:
                procs.pop(pid, None)
        net = psutil.net_io_counters()
        sample = {"t": time.monotonic(), "cpu": cpu,
                  "net_sent": net.bytes_sent, "net_recv": net.bytes_recv}
        sys.stdout.write(json.dumps(sample) + "\n")
        sys.stdout.flush()
        next_tick += args.interval
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            next_tick = time.monotonic()


if __name__ == "__main__":
    main()
