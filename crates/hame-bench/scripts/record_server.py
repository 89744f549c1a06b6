"""The peer benchmark's fake OpenAI server, recording each chat request body to a directory."""
import os, sys, itertools, io
sys.path.insert(0, os.environ.get("PEERS_DIR", "../shared/bench/peers"))
from common import fake_openai_server as f
OUT = os.environ["REC_DIR"]
os.makedirs(OUT, exist_ok=True)
counter = itertools.count()
orig = f.Handler.do_POST
def do_POST(self):
    n = int(self.headers.get("content-length") or 0)
    raw = self.rfile.read(n) if n else b"{}"
    if self.path.rstrip("/").endswith("/chat/completions"):
        with open(os.path.join(OUT, f"{next(counter):04d}.json"), "wb") as fh:
            fh.write(raw)
    self.rfile = io.BytesIO(raw)
    return orig(self)
f.Handler.do_POST = do_POST
f.main()
