#!/usr/bin/env python3
"""Scale run for the ModelPlacement controller: many kwok fake nodes with synthetic
AcceleratorInventories, hundreds of ModelPlacements, and how long the controller takes.

Usage (from `make scale`, which starts the cluster and builds the release binary):
    scripts/scale.py [--nodes 1000] [--placements 300]

Inventories are the real agent's output for fixture hosts (8x H100 NVSwitch, 8x MI300X, a
CPU-only VM), renamed per node; A100 and L4 nodes are derived from the H100 one. Prints one
line of figures: time until every placement has a status, how many were planned, reconcile
p50/p99 from the controller's own histogram, and the controller's peak RSS.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "hwaccel")
KUBECTL = os.path.join(os.environ["TESTCLUSTER_BIN"], "kubectl")


def kubectl(*args, stdin=None):
    return subprocess.run([KUBECTL, *args], input=stdin, capture_output=True, text=True, check=True).stdout


def fixture_inventory(scenario):
    host = os.path.join(ROOT, "fixtures", "hosts", scenario)
    out = subprocess.run(
        [BIN, "detect", "--host-root", host, "--tool-path", os.path.join(host, "commands"),
         "--backends", "all,-vulkan", "--as-inventory", "template", "-o", "json"],
        capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def derived(h100, model, product, memory_mi, arch, capability, precisions, count, interconnect):
    """An inventory like the H100 one with another product (A100, L4)."""
    inv = copy.deepcopy(h100)
    devices = inv["spec"]["devices"]
    gpus = [d for d in devices if d["name"].startswith("gpu-")][:count]
    others = [d for d in devices if not d["name"].startswith("gpu-")]
    for d in gpus:
        a = d["attributes"]
        a["model"] = {"string": model}
        a["product"] = {"string": product}
        a["architecture"] = {"string": arch}
        a["computeCapability"] = {"string": capability}
        a["precisions"] = {"string": precisions}
        if not interconnect:
            a.pop("interconnect", None)
            a.pop("interconnectGroup", None)
        d["capacity"]["memory"] = f"{memory_mi}Mi"
    inv["spec"]["devices"] = gpus + others
    if not interconnect:
        inv["spec"]["interconnects"] = []
    inv["spec"]["summary"] = {"accelerators": count, "product": model, "memory": f"{memory_mi * count}Mi"}
    return inv


def templates():
    h100 = fixture_inventory("h100-8x-nvswitch")
    return [
        # (share of the fleet, kind, inventory)
        (0.30, "h100", h100),
        (0.20, "a100", derived(h100, "NVIDIA A100-SXM4-80GB", "nvidia-a100-sxm4-80gb", 81920, "ampere", "8.0",
                               "fp32,tf32,bf16,fp16,int8,int4", 8, True)),
        (0.10, "mi300x", fixture_inventory("mi300x-8x")),
        (0.30, "l4", derived(h100, "NVIDIA L4", "nvidia-l4", 23034, "ada", "8.9",
                             "fp32,tf32,bf16,fp16,fp8,int8,int4", 4, False)),
        (0.10, "cpu", fixture_inventory("cpu-only-vm")),
    ]


def apply_batches(docs, batch=200):
    for i in range(0, len(docs), batch):
        kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=hwaccel-scale", "-f", "-",
                stdin="\n---\n".join(json.dumps(d) for d in docs[i:i + batch]))


def make_fleet(n):
    nodes, inventories = [], []
    index = 0
    for share, kind, template in templates():
        for _ in range(round(n * share)):
            name = f"scale-{kind}-{index:04d}"
            index += 1
            nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                        "type": "kwok", "hwaccel.io/scale": kind}},
            })
            inv = copy.deepcopy(template)
            inv["metadata"] = {"name": name}
            inv["spec"]["nodeName"] = name
            inventories.append(inv)
    return nodes, inventories


MODELS = [
    ("llama-3.1-8b", {"serve": {"context": 8192, "concurrency": 8}}),
    ("llama-3.1-8b", {"serve": {"context": 32768, "concurrency": 4}}),
    ("llama-3.1-70b", {"serve": {"context": 16384, "concurrency": 8}}),
    ("qwen2.5-7b", {"serve": {"context": 8192, "concurrency": 16}}),
    ("mistral-7b", {"train": {"method": "lora", "seqLen": 4096, "microBatch": 1}}),
]


def placements(n, namespace):
    docs = []
    for i in range(n):
        preset, goal = MODELS[i % len(MODELS)]
        docs.append({
            "apiVersion": "hwaccel.io/v1alpha1", "kind": "ModelPlacement",
            "metadata": {"name": f"mp-{i:04d}", "namespace": namespace},
            "spec": {"model": {"preset": preset}, "goal": goal, "replicas": 1},
        })
    return docs


def metrics_text(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def quantile(text, q):
    """q-quantile (upper bucket bound) of the first histogram whose name has 'reconcile'."""
    buckets = []
    for line in text.splitlines():
        if "reconcile" in line and "_bucket{" in line and not line.startswith("#"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    if not buckets:
        return None
    merged = {}
    for le, count in buckets:
        merged[le] = merged.get(le, 0) + count
    ordered = sorted(merged.items())
    total = ordered[-1][1]
    for le, count in ordered:
        if total and count >= q * total:
            return le
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--placements", type=int, default=300)
    parser.add_argument("--port", type=int, default=18080)
    args = parser.parse_args()

    kubectl("apply", "--server-side", "-f", os.path.join(ROOT, "crds"))
    kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kubectl("create", "namespace", "scale")
    nodes, inventories = make_fleet(args.nodes)
    started = time.time()
    apply_batches(nodes)
    apply_batches(inventories)
    print(f"fleet: {len(nodes)} nodes and inventories applied in {time.time() - started:.1f} s", file=sys.stderr)

    controller = subprocess.Popen(
        [BIN, "controller", "--metrics-addr", f"127.0.0.1:{args.port}", "--leader-election-namespace", "scale",
         "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(ROOT, "target", "scale-controller.log"), "w"))
    try:
        time.sleep(3)
        started = time.time()
        apply_batches(placements(args.placements, "scale"))
        created = time.time()
        deadline = created + 300
        while time.time() < deadline:
            items = json.loads(kubectl("get", "mp", "-n", "scale", "-o", "json"))["items"]
            states = [((i.get("status") or {}).get("state")) for i in items]
            if len(states) == args.placements and all(states):
                break
            time.sleep(1)
        settled = time.time() - created
        planned = sum(1 for s in states if s == "Planned")
        text = metrics_text(args.port)
        with open(f"/proc/{controller.pid}/status") as status:
            hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
        p50, p99 = quantile(text, 0.50), quantile(text, 0.99)
        print(f"nodes={len(nodes)} placements={args.placements} create_s={created - started:.1f} "
              f"all_status_s={settled:.1f} planned={planned} "
              f"reconcile_p50_le_s={p50} reconcile_p99_le_s={p99} controller_peak_rss_mib={hwm / 1024:.1f}")
    finally:
        controller.terminate()
        controller.wait(timeout=30)


if __name__ == "__main__":
    main()
