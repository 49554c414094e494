"""A Lithops map on the localhost backend (version 2): each call burns CPU, then downloads
bytes over a raw socket from an HTTP server in this, the driver's, process, counting every
byte it receives. Prints one JSON line per call: Lithops' ids, what the call counted, and
Lithops' own stats.

Usage: lithops_map.py CALLS BURN_SECONDS DOWNLOAD_BYTES
The runtime Lithops starts each call's runner with is $WP_LITHOPS_RUNTIME if set (a wrapper
that measures the runner), else this Python."""
import json
import os
import sys

import lithops

import payload_server

CALLS, BURN_S, DOWNLOAD = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
PORT = payload_server.serve(DOWNLOAD)


def work(index):
    import os
    import socket
    import time

    started = time.process_time()
    x = 0
    while time.process_time() - started < BURN_S:
        for i in range(10000):
            x = (x * 31 + i) % 1000003
    received = 0
    with socket.create_connection(("127.0.0.1", PORT)) as connection:
        connection.sendall(b"GET /data HTTP/1.0\r\nHost: local\r\n\r\n")
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += len(chunk)
    return {
        "index": index,
        "pid": os.getpid(),
        "process_cpu_s": time.process_time(),
        "received": received,
    }


config = {
    "lithops": {"backend": "localhost", "storage": "localhost", "log_level": "WARNING"},
    "localhost": {"version": 2, "runtime": os.environ.get("WP_LITHOPS_RUNTIME", sys.executable)},
}
executor = lithops.FunctionExecutor(config=config)
futures = executor.map(work, list(range(CALLS)))
results = executor.get_result(futures)
for future, result in zip(futures, results):
    stats = {k: v for k, v in future.stats.items() if k.startswith("worker_")}
    print(
        json.dumps(
            {
                "executor_id": future.executor_id,
                "job_id": future.job_id,
                "call_id": future.call_id,
                "result": result,
                "stats": stats,
            }
        )
    )
executor.clean()
