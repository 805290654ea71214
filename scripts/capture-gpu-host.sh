#!/usr/bin/env bash
# Captures, on a real NVIDIA GPU machine, everything hwaccel's NVIDIA backend reads, so the
# detector can be checked against real bytes (fixtures/hosts/<name>/, fixtures/captures/):
#
#   * nvidia-smi: the exact argument lists `hwaccel detect` runs (recorded through a logging
#     stand-in on --tool-path) and the common human forms (-L, -q, -q -x, topo -m, nvlink -s,
#     every --query-gpu field the driver offers);
#   * NVML as libnvidia-ml answers the calls our loader makes (through nvidia-ml-py when the
#     machine has it);
#   * the host files: the PCI functions' sysfs attributes and links, /proc/driver/nvidia,
#     /proc/cpuinfo and meminfo, NUMA nodes, /dev names;
#   * `hwaccel detect` from the static musl build (nvidia-smi path) and the glibc build (NVML
#     path): JSON, table, --timings, wall time and peak RSS of repeated runs;
#   * the CUDA runtime's view of memory (what an engine budgets from) beside nvidia-smi's.
#
# Usage: scripts/capture-gpu-host.sh OUT_DIR MUSL_BINARY GLIBC_BINARY
# Writes OUT_DIR/capture.tar.gz and OUT_DIR/log.txt. Reads only; changes nothing on the host
# (its temporary files live under a mktemp directory it removes). Serial numbers and UUIDs are
# masked afterwards, on the machine that keeps the fixtures (docs/detection.md, "Real captures").
set -u

out=${1:?OUT_DIR} musl=${2:?MUSL_BINARY} glibc=${3:?GLIBC_BINARY}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cap="$work/capture"
mkdir -p "$cap"/{smi,smi-as-run,host,detect,nvml,cuda} "$out"
exec > >(tee "$out/log.txt") 2>&1

# Every command is bounded: a wedged driver must not eat the machine's lease.
bounded() { timeout --kill-after=5 60 "$@"; }
# save NAME CMD...: stdout exactly as printed, stderr and the exit code beside it.
save() {
    local name=$1
    shift
    bounded "$@" >"$cap/$name" 2>"$cap/$name.stderr"
    echo "$?" >"$cap/$name.rc"
    echo "captured $name (rc $(cat "$cap/$name.rc"), $(wc -c <"$cap/$name") bytes)"
}

echo "== machine"
date -u +%Y-%m-%dT%H:%M:%SZ | tee "$cap/date.txt"
uname -a | tee "$cap/uname.txt"
real_smi=$(command -v nvidia-smi || true)
echo "nvidia-smi at: ${real_smi:-none}"

echo "== nvidia-smi, human forms"
if [ -n "$real_smi" ]; then
    save smi/default.txt "$real_smi"
    save smi/L.txt "$real_smi" -L
    save smi/q.txt "$real_smi" -q
    save smi/q.xml "$real_smi" -q -x
    save smi/topo-m.txt "$real_smi" topo -m
    save smi/nvlink-s.txt "$real_smi" nvlink -s
    save smi/mig-lgip.txt "$real_smi" mig -lgip
    save smi/help-query-gpu.txt "$real_smi" --help-query-gpu
    # Every field the help names, dropping the ones this driver refuses (a bounded number of
    # times), so the capture shows each field's real spelling of "not available".
    fields=$(grep -o '^"[^"]*"' "$cap/smi/help-query-gpu.txt" | tr -d '"' | paste -sd, -)
    for _ in $(seq 1 40); do
        bounded "$real_smi" --query-gpu="$fields" --format=csv >"$cap/smi/query-gpu-all.csv" 2>&1
        bad=$(grep -o 'Field "[^"]*" is not a valid field to query' "$cap/smi/query-gpu-all.csv" | head -1 | cut -d'"' -f2)
        [ -z "$bad" ] && break
        echo "  driver refuses field $bad"
        fields=$(printf '%s' "$fields" | tr , '\n' | grep -vxF "$bad" | paste -sd, -)
    done
    save smi/query-remapped-rows-all.csv "$real_smi" --query-remapped-rows=gpu_bus_id,gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv
    save smi/query-retired-pages.csv "$real_smi" --query-retired-pages=gpu_bus_id,gpu_uuid,retired_pages.address,retired_pages.cause --format=csv
fi

echo "== host files"
python3 - "$cap/host" <<'PY'
import os, sys, stat
dest = sys.argv[1]
SKIP = {"config", "rom", "remove", "rescan", "reset", "reset_method", "new_id", "remove_id",
        "bind", "unbind", "uevent_helper", "driver_override", "modalias"}
def copy_file(path):
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or not (st.st_mode & 0o444):
            return
        with open(path, "rb") as f:
            data = f.read(65536)
    except OSError:
        return
    target = dest + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(data)
def copy_link(path):
    try:
        target = os.readlink(path)
    except OSError:
        return
    os.makedirs(os.path.dirname(dest + path), exist_ok=True)
    if not os.path.lexists(dest + path):
        os.symlink(target, dest + path)
def copy_dir_files(path, links=("driver", "iommu_group", "physfn", "device")):
    # `subsystem` is left out: it points back up the tree (a loop in a fixture checkout).
    try:
        names = os.listdir(path)
    except OSError:
        return
    for name in names:
        full = os.path.join(path, name)
        if os.path.islink(full):
            if name in links:
                copy_link(full)
        elif name not in SKIP and not name.startswith("resource") and os.path.isfile(full):
            copy_file(full)
# Every PCI function, with the bridges above it (their link speeds are the path's).
bus = "/sys/bus/pci/devices"
for name in sorted(os.listdir(bus)) if os.path.isdir(bus) else []:
    copy_link(os.path.join(bus, name))
    real = os.path.realpath(os.path.join(bus, name))
    parts = real.split("/")
    for i in range(4, len(parts) + 1):
        copy_dir_files("/".join(parts[:i]))
for d in ("/sys/bus/pci/drivers",):
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        os.makedirs(dest + os.path.join(d, name), exist_ok=True)
for d in ("/sys/devices/system/node", "/sys/devices/system/cpu"):
    if os.path.isdir(d):
        copy_dir_files(d)
        for name in sorted(os.listdir(d)):
            if name.startswith("node") and name[4:].isdigit():
                copy_dir_files(os.path.join(d, name))
for f in ("/proc/cpuinfo", "/proc/meminfo", "/proc/version", "/etc/os-release",
          "/sys/module/nvidia/version", "/proc/sys/kernel/osrelease"):
    copy_file(f)
for root, dirs, files in os.walk("/proc/driver/nvidia"):
    if root.count("/") > 7:
        continue
    for name in files:
        copy_file(os.path.join(root, name))
for d in ("/sys/class/infiniband", "/sys/class/net"):
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            copy_link(os.path.join(d, name))
with open(os.path.join(dest, "dev-names.txt"), "w") as f:
    for name in sorted(os.listdir("/dev")):
        f.write(name + "\n")
PY
echo "host files: $(find "$cap/host" -type f | wc -l) files, $(find "$cap/host" -type l | wc -l) links"

echo "== NVML through nvidia-ml-py"
python3 - >"$cap/nvml/nvml.json" 2>"$cap/nvml/nvml.stderr" <<'PY'
import json
import pynvml as n
def get(f, *a):
    try:
        v = f(*a)
        if isinstance(v, bytes):
            v = v.decode()
        if hasattr(v, "_fields_"):
            v = {k: (getattr(v, k).decode() if isinstance(getattr(v, k), bytes) else getattr(v, k))
                 for k, _ in v._fields_ if not isinstance(getattr(v, k), (list,)) }
        return v
    except n.NVMLError as e:
        return {"error": str(e)}
    except Exception as e:  # an old binding without the call
        return {"error": repr(e)}
n.nvmlInit()
out = {"driver": get(n.nvmlSystemGetDriverVersion), "nvml": get(n.nvmlSystemGetNVMLVersion),
       "cuda_driver": get(n.nvmlSystemGetCudaDriverVersion_v2), "devices": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    d = {"index": i, "name": get(n.nvmlDeviceGetName, h), "uuid": get(n.nvmlDeviceGetUUID, h),
         "serial": get(n.nvmlDeviceGetSerial, h), "pci": get(n.nvmlDeviceGetPciInfo_v3, h),
         "vbios": get(n.nvmlDeviceGetVbiosVersion, h), "memory": get(n.nvmlDeviceGetMemoryInfo, h),
         "memory_v2": get(n.nvmlDeviceGetMemoryInfo, h, n.nvmlMemory_v2),
         "bar1": get(n.nvmlDeviceGetBAR1MemoryInfo, h),
         "cuda_cc": get(n.nvmlDeviceGetCudaComputeCapability, h),
         "mig_mode": get(n.nvmlDeviceGetMigMode, h),
         "max_mig_devices": get(n.nvmlDeviceGetMaxMigDeviceCount, h),
         "ecc_mode": get(n.nvmlDeviceGetEccMode, h),
         "ecc_corrected_volatile": get(n.nvmlDeviceGetTotalEccErrors, h, 0, 0),
         "ecc_uncorrected_volatile": get(n.nvmlDeviceGetTotalEccErrors, h, 1, 0),
         "ecc_corrected_aggregate": get(n.nvmlDeviceGetTotalEccErrors, h, 0, 1),
         "ecc_uncorrected_aggregate": get(n.nvmlDeviceGetTotalEccErrors, h, 1, 1),
         "retired_single": get(n.nvmlDeviceGetRetiredPages, h, 0),
         "retired_double": get(n.nvmlDeviceGetRetiredPages, h, 1),
         "retired_pending": get(n.nvmlDeviceGetRetiredPagesPendingStatus, h),
         "remapped_rows": get(n.nvmlDeviceGetRemappedRows, h),
         "pcie_gen_max": get(n.nvmlDeviceGetMaxPcieLinkGeneration, h),
         "pcie_width_max": get(n.nvmlDeviceGetMaxPcieLinkWidth, h),
         "pcie_gen_current": get(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
         "pcie_width_current": get(n.nvmlDeviceGetCurrPcieLinkWidth, h),
         "numa_node": get(n.nvmlDeviceGetNumaNodeId, h) if hasattr(n, "nvmlDeviceGetNumaNodeId") else None,
         "power_limit_mw": get(n.nvmlDeviceGetEnforcedPowerLimit, h),
         "persistence": get(n.nvmlDeviceGetPersistenceMode, h),
         "compute_mode": get(n.nvmlDeviceGetComputeMode, h),
         "fabric": get(n.nvmlDeviceGetGpuFabricInfo, h) if hasattr(n, "nvmlDeviceGetGpuFabricInfo") else None,
         "nvlink": [get(n.nvmlDeviceGetNvLinkState, h, l) for l in range(18)]}
    out["devices"].append(d)
n.nvmlShutdown()
print(json.dumps(out, indent=2, default=str))
PY
echo "nvml: rc $?, $(wc -c <"$cap/nvml/nvml.json") bytes; $(head -c 300 "$cap/nvml/nvml.stderr")"

echo "== CUDA runtime memory beside nvidia-smi"
python3 - >"$cap/cuda/memory.json" 2>"$cap/cuda/memory.stderr" <<'PY'
import json, subprocess, torch
def smi():
    r = subprocess.run(["nvidia-smi", "--query-gpu=memory.total,memory.reserved,memory.used,memory.free",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=60)
    return r.stdout.strip()
before = smi()
torch.cuda.init()
x = torch.empty(1, device="cuda")
free, total = torch.cuda.mem_get_info()
p = torch.cuda.get_device_properties(0)
after = smi()
# The largest single allocation the runtime grants now (binary search, 64 MiB steps).
lo, hi = 0, free // (64 << 20) + 1
while hi - lo > 1:
    mid = (lo + hi) // 2
    try:
        y = torch.empty(mid * (64 << 20), dtype=torch.uint8, device="cuda")
        del y
        torch.cuda.empty_cache()
        lo = mid
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        hi = mid
print(json.dumps({"torch": torch.__version__, "cuda_runtime": torch.version.cuda,
                  "name": p.name, "total_memory_props": p.total_memory,
                  "mem_get_info_free": free, "mem_get_info_total": total,
                  "multiprocessors": p.multi_processor_count, "cc": [p.major, p.minor],
                  "largest_allocation_bytes": lo * (64 << 20),
                  "smi_total_reserved_used_free_MiB_before": before,
                  "smi_total_reserved_used_free_MiB_after_context": after}, indent=2))
PY
echo "cuda: rc $?; $(cat "$cap/cuda/memory.json")"

echo "== hwaccel detect, both builds, recording the tool runs"
shim="$work/shim"
mkdir -p "$shim"
cat >"$shim/nvidia-smi" <<EOF
#!/usr/bin/env bash
# Logs each run of nvidia-smi that hwaccel makes, with its output, then answers as the real one.
n=\$(date +%s%N)
printf '%s\n' "\$@" >"$cap/smi-as-run/\$n.args"
"$real_smi" "\$@" >"$cap/smi-as-run/\$n.stdout" 2>"$cap/smi-as-run/\$n.stderr"
rc=\$?
echo \$rc >"$cap/smi-as-run/\$n.rc"
cat "$cap/smi-as-run/\$n.stdout"; cat "$cap/smi-as-run/\$n.stderr" >&2
exit \$rc
EOF
chmod +x "$shim/nvidia-smi"
for build in musl glibc; do
    bin=$musl
    [ "$build" = glibc ] && bin=$glibc
    chmod +x "$bin"
    "$bin" --version | tee "$cap/detect/$build.version"
    ldd "$bin" >"$cap/detect/$build.ldd" 2>&1
    save "detect/$build.json" "$bin" detect --tool-path "$shim" -o json
    save "detect/$build.table.txt" "$bin" detect --tool-path "$shim"
    save "detect/$build.timings.txt" "$bin" detect --timings --tool-path "$shim"
    # Without the stand-in: what the agent would run, timed, 10 runs.
    python3 - "$bin" >"$cap/detect/$build.runs.json" <<'PY'
import json, resource, subprocess, sys, time
walls = []
for _ in range(10):
    t = time.monotonic()
    subprocess.run([sys.argv[1], "detect", "-o", "json"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120)
    walls.append(round(time.monotonic() - t, 4))
print(json.dumps({"wall_s": walls, "max_rss_kib_of_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
PY
    echo "$build runs: $(cat "$cap/detect/$build.runs.json")"
done
# NVML vouched for as the chart's NVML agents do, reading the host under a different root
# spelling, to prove the container path loads the library too.
HWACCEL_NVML=container save detect/glibc-vouched.json "$glibc" detect --host-root / -o json

echo "== summary"
ls -la "$cap"/smi-as-run | head -40
tar -C "$work" -czf "$out/capture.tar.gz" capture
ls -la "$out"
