"""A Dask LocalCluster of worker processes runs tasks that each burn CPU, then download bytes
over a raw socket from an HTTP server in this, the client's, process. Prints one JSON line
per task (the worker process that ran it, the CPU it measured, the bytes it sent and
received), then one line with the worker processes' pids.

Usage: dask_map.py WORKERS TASKS BURN_SECONDS DOWNLOAD_BYTES [PORT]"""
import json
import os
import sys

from dask.distributed import Client, LocalCluster

import payload_server

WORKERS, TASKS = int(sys.argv[1]), int(sys.argv[2])
BURN_S, DOWNLOAD = float(sys.argv[3]), int(sys.argv[4])
PORT = int(sys.argv[5]) if len(sys.argv) > 5 else 0


def work(index, port, burn_s):
    import os
    import socket
    import time

    started = time.thread_time()
    x = 0
    while time.thread_time() - started < burn_s:
        for i in range(10000):
            x = (x * 31 + i) % 1000003
    received = 0
    request = b"GET /data HTTP/1.0\r\nHost: local\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(request)
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            received += len(chunk)
    return {"index": index, "pid": os.getpid(), "burned_s": time.thread_time() - started,
            "sent": len(request), "received": received}


if __name__ == "__main__":
    port = payload_server.serve(DOWNLOAD, PORT)
    cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    client = Client(cluster)
    futures = client.map(work, range(TASKS), port=port, burn_s=BURN_S, pure=False)
    for result in client.gather(futures):
        print(json.dumps(result))
    pids = sorted(client.run(os.getpid).values())
    client.close()
    cluster.close()
    print(json.dumps({"worker_pids": pids}))
