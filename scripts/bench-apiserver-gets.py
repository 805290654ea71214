#!/usr/bin/env python3
# CPU the test apiserver and etcd spend on N metadata GETs of one Node over one keep-alive TLS
# connection: what one of the agent's former per-cycle reads cost (docs/decisions/0010).
#
#   D=$(mktemp -d); tests/cluster/up.sh $D
#   python3 scripts/bench-apiserver-gets.py $D 3000
#   tests/cluster/down.sh $D
import http.client, json, ssl, sys, time
D = sys.argv[1]; N = int(sys.argv[2])
port = int(open(f"{D}/run/apiserver.port").read().strip())
pids = {"apiserver": int(open(f"{D}/run/kube-apiserver.pid").read()), "etcd": int(open(f"{D}/run/etcd.pid").read())}
ctx = ssl.create_default_context(cafile=f"{D}/pki/ca.crt")
ctx.load_cert_chain(f"{D}/pki/admin.crt", f"{D}/pki/admin.key"); ctx.check_hostname = False
c = http.client.HTTPSConnection("127.0.0.1", port, context=ctx)
def req(method, path, body=None, headers={}):
    c.request(method, path, body=body, headers=headers); r = c.getresponse(); return r.status, r.read()
req("POST", "/api/v1/nodes", json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cost-probe"}}), {"Content-Type": "application/json"})
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split(); return (int(f[11]) + int(f[12])) / 100.0
meta = {"Accept": "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"}
before = {k: cpu(p) for k, p in pids.items()}; t = time.time()
for _ in range(N):
    s, _ = req("GET", "/api/v1/nodes/cost-probe", headers=meta); assert s == 200
wall = time.time() - t; after = {k: cpu(p) for k, p in pids.items()}
for k in pids:
    print(f"{k}: {(after[k]-before[k])/N*1000:.2f} ms CPU per GET ({N} GETs in {wall:.1f} s)")
