"""The image's HEALTHCHECK: exit 0 when the bot in this container answers GET /healthz.

Plain urllib (the slim base has no curl), straight to the port this container listens on: never
through a proxy from the environment (HTTP_PROXY would send a loopback check elsewhere).
"""

import os
import sys
import urllib.request

PORT = os.environ.get("PORT", "3000")
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(f"http://127.0.0.1:{PORT}/healthz", timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError as exc:  # refused, timed out, or an HTTP error status
    print(f"healthz: {exc}", file=sys.stderr)
    sys.exit(1)
