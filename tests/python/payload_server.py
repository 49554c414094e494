"""An HTTP server in the calling process that answers every GET with the same payload, for
the frameworks' tasks to download from (its traffic is the driver's, not theirs)."""
import http.server
import threading


def serve(size, port=0):
    """Starts the server on loopback `port` (0: a free one) in a daemon thread; returns the
    port."""
    payload = b"x" * size

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]
