"""kvdir's CPU per applied live batch, one vLLM-dialect engine publishing at a fixed rate, with
kvdir connecting to the engine (`connect`) or the engine connecting to kvdir's kv_events_bind
(`bind`). Runs in the vllm venv (pyzmq, msgspec); the engine's HTTP side is a stub answering
/health and /metrics, its history replay is empty (the batches come after the stream is live).

    python scripts/bind_cpu.py connect|bind RATE SECONDS path/to/kvdir

Prints kvdir's user+system CPU (from /proc) over the run divided by the batches applied.
Indicative only: it includes kvdir's idle costs (engine polls) over the run."""
import http.server, json, os, socket, subprocess, sys, threading, time, urllib.request
import msgspec, zmq

MODE = sys.argv[1]          # bind | connect
RATE = int(sys.argv[2])     # batches per second
SECS = float(sys.argv[3])
KVDIR = sys.argv[4]
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"" if self.path == "/health" else (b"process_start_time_seconds 1.0\n"
            b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n")
        self.send_response(200); self.send_header("content-length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=web.serve_forever, daemon=True).start()
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER); router.bind("tcp://127.0.0.1:*")
replay = router.getsockopt_string(zmq.LAST_ENDPOINT)
def serve():
    while True:
        f = router.recv_multipart()
        router.send_multipart([f[0], b"", b"", b"\xff" * 8, b""])
threading.Thread(target=serve, daemon=True).start()
port, http_port = free(), free()
if MODE == "bind":
    pub = ctx.socket(zmq.XPUB); pub.connect(f"tcp://127.0.0.1:{port}")
    events, extra = '"bind"', {"kv_events_bind": {"endpoint": f"tcp://127.0.0.1:{port}", "topic": "kv"}}
else:
    pub = ctx.socket(zmq.XPUB); pub.bind(f"tcp://127.0.0.1:{port}")
    events, extra = f'"tcp://127.0.0.1:{port}"', {}
pub.setsockopt(zmq.SNDHWM, 0)
cfg = dict(extra, engines=[{"name": "e", "url": f"http://127.0.0.1:{web.server_port}", "dialect": "vllm",
    "events": json.loads(events), "replay": replay, "dp_size": 1, "block_size": 16, "topic": "kv"}],
    engine_poll_interval_ms=100)
open("/tmp/kvdir-bind-cpu.json", "w").write(json.dumps(cfg))
kv = subprocess.Popen([KVDIR, "--kv_events_config_file=/tmp/kvdir-bind-cpu.json", f"--http_server_port={http_port}",
    "--etcd_addr="], stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{http_port}"
def get(p):
    return urllib.request.urlopen(base + p, timeout=2).read().decode()
while True:
    try:
        s = json.loads(get("/v1/internal/streams"))["streams"]
        if s and s[0]["phase"] == "live": break
    except Exception: pass
    time.sleep(0.1)
while pub.recv(): break  # kvdir's subscription
enc = msgspec.msgpack.Encoder()
def batch(i):
    toks = list(range(i * 16, i * 16 + 16))
    return enc.encode([time.time(), [["BlockStored", [i + 1], None, toks, 16, None, "GPU", None, None]], 0])
def cpu():
    f = open(f"/proc/{kv.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
time.sleep(1)
c0, t0, n = cpu(), time.monotonic(), int(RATE * SECS)
for i in range(n):
    pub.send_multipart([b"kv", i.to_bytes(8, "big"), batch(i)])
    ahead = (i + 1) / RATE - (time.monotonic() - t0)
    if ahead > 0: time.sleep(ahead)
while True:
    m = get("/metrics")
    applied = [l for l in m.splitlines() if l.startswith("kvdir_batches_applied_total")]
    if applied and float(applied[0].split()[-1]) >= n: break
    time.sleep(0.05)
c1, t1 = cpu(), time.monotonic()
s = json.loads(get("/v1/internal/streams"))["streams"][0]
print(f"{MODE}: {n} batches at {RATE}/s in {t1 - t0:.1f} s, kvdir CPU {c1 - c0:.2f} s = "
      f"{(c1 - c0) / n * 1e6:.0f} us/batch; gaps {s['gaps']}, phase {s['phase']}")
kv.terminate(); kv.wait()
