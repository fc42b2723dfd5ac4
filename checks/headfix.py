"""A head's API on 127.0.0.1 for launch tests: /health answers 200, a chat request gets a fixed stream."""

import http.server
import socket

import http_standin


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, chat_body: bytes) -> http_standin.StandinServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(chat_body)))
            self.end_headers()
            self.wfile.write(chat_body)

    return http_standin.serve(Handler, port=port)
