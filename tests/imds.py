"""A small instance metadata service (IMDSv2) for tests: a session token, then the spot
interruption notice, given only to the nodes (source addresses) told to get one, and any other
meta-data paths a test sets (`meta`: this machine's VPC for `nodes up --address auto`).

Also a program, to see a spot notice acted on by hand (docs/launch.md, "Spot notices"): serve on
ADDRESS:PORT and give NODE (repeatable) a notice once SECONDS have passed:

    python3 tests/imds.py --listen 10.213.0.1:8111 --notice 10.213.0.12 --after 30
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN = "dtrain-test-token"


class Imds:
    def __init__(self, address: str, port: int = 0):
        self.notice: set[str] = set()  # source addresses that get a notice
        self.meta: dict[str, str] = {}  # other meta-data paths (after /latest/meta-data/) and their values
        self.asked: dict[str, int] = {}  # notice requests per source address
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code: int, body: str = "") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self):
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, TOKEN)
                return self._send(400)

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
                    return self._send(401)
                if self.path.removeprefix("/latest/meta-data/") in imds.meta:
                    return self._send(200, imds.meta[self.path.removeprefix("/latest/meta-data/")])
                if self.path != "/latest/meta-data/spot/instance-action":
                    return self._send(404)
                src = self.client_address[0]
                imds.asked[src] = imds.asked.get(src, 0) + 1
                if src in imds.notice:
                    return self._send(200, json.dumps({"action": "terminate", "time": "2026-11-23T03:00:00Z"}))
                return self._send(404)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a stand-in IMDSv2 that gives nodes a spot notice")
    ap.add_argument("--listen", required=True, help="ADDRESS:PORT (the simulated cluster's bridge: 10.213.0.1:8111)")
    ap.add_argument("--notice", action="append", default=[], help="a node's address that gets the notice (repeat)")
    ap.add_argument("--after", type=float, default=0.0, help="seconds before the notice (0: at once)")
    args = ap.parse_args(argv)
    address, _, port = args.listen.rpartition(":")
    imds = Imds(address, int(port))
    print(f"AWS_EC2_METADATA_SERVICE_ENDPOINT={imds.url}", flush=True)
    time.sleep(args.after)
    imds.notice.update(args.notice)
    print(f"spot notice for {', '.join(args.notice) or 'no node'}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
