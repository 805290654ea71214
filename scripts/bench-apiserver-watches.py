#!/usr/bin/env python3
# What held watches cost the test apiserver (docs/decisions/0010): opens N watches, each
# field-selected to one name and on its own HTTP/1.1 TLS connection (as kube-rs makes them),
# and reports the apiserver's CPU over 130 s without and with them (two bookmark rounds), and
# its memory (RSS, Go heap, goroutines) per watch.
#
#   D=$(mktemp -d); tests/cluster/up.sh $D
#   ulimit -n 8192; python3 scripts/bench-apiserver-watches.py $D 2000 /api/v1/nodes
#   tests/cluster/down.sh $D
import asyncio, json, ssl, sys, time, urllib.request
D = sys.argv[1]; N = int(sys.argv[2]); RESOURCE = sys.argv[3]
host = "127.0.0.1"
port = int(open(f"{D}/run/apiserver.port").read().strip())
pid = int(open(f"{D}/run/kube-apiserver.pid").read().strip())
ctx = ssl.create_default_context(cafile=f"{D}/pki/ca.crt")
ctx.load_cert_chain(f"{D}/pki/admin.crt", f"{D}/pki/admin.key")
ctx.check_hostname = False
def get(path):
    req = urllib.request.Request(f"https://{host}:{port}{path}")
    return urllib.request.urlopen(req, context=ctx).read()
def mem():
    rss = int([l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]) * 1024
    m = get("/metrics").decode()
    heap = [l for l in m.splitlines() if l.startswith("go_memstats_heap_inuse_bytes")][0].split()[1]
    gor = [l for l in m.splitlines() if l.startswith("go_goroutines")][0].split()[1]
    return rss, float(heap), int(float(gor))
rv = json.loads(get(f"{RESOURCE}?limit=1"))["metadata"]["resourceVersion"]
async def open_watch(i):
    r, w = await asyncio.open_connection(host, port, ssl=ctx)
    path = f"{RESOURCE}?watch=true&allowWatchBookmarks=true&timeoutSeconds=600&resourceVersion={rv}&fieldSelector=metadata.name%3Dw-{i}"
    w.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: watch-probe\r\n\r\n".encode())
    await w.drain()
    line = await r.readline()
    assert b"200" in line, line
    return r, w
async def main():
    def cpu0():
        f = open(f"/proc/{pid}/stat").read().split(")")[1].split(); return (int(f[11]) + int(f[12])) / 100.0
    b0 = cpu0(); await asyncio.sleep(130); b1 = cpu0()
    print(f"apiserver CPU with no probe watch for 130 s: {b1-b0:.2f} s", flush=True)
    base = mem(); print("before", base, flush=True)
    conns = []
    for start in range(0, N, 100):
        conns += await asyncio.gather(*[open_watch(i) for i in range(start, min(N, start + 100))])
    def cpu():
        f = open(f"/proc/{pid}/stat").read().split(")")[1].split(); return (int(f[11]) + int(f[12])) / 100.0
    await asyncio.sleep(10)
    c0 = cpu(); await asyncio.sleep(130); c1 = cpu()
    print(f"apiserver CPU while holding {N} watches for 130 s: {c1-c0:.2f} s", flush=True)
    held = mem(); print("held", N, held, flush=True)
    print(f"per watch: rss {(held[0]-base[0])/N/1024:.1f} KiB, heap {(held[1]-base[1])/N/1024:.1f} KiB, goroutines {(held[2]-base[2])/N:.1f}")
    for r, w in conns: w.close()
    await asyncio.sleep(5)
    print("after", mem())
asyncio.run(main())
