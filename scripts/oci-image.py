#!/usr/bin/env python3
"""Assemble the hwaccel images as OCI image archives without a container engine.

`make image` runs this on the cargo-built binaries: no base image is pulled. The `static`
image holds the static musl binary and the few files distroless/static would add that a
process may read (an /etc/passwd and /etc/group naming the nonroot user, so tools that map
uid 65532 to a name find one). The `glibc` image adds, from the build machine, the shared
libraries the glibc binary links (found with ldd) and the dynamic loader, at the same paths,
so the binary can also dlopen a runtime-injected libnvidia-ml.so.1.

Both images describe themselves as the Dockerfile's stages of the same name do: entrypoint
`/hwaccel`, user 65532:65532, and the same labels (tests/dockerfile.rs compares them).

The archive is an OCI image layout in a tar (the format `ctr images import`, `podman load`
and `skopeo copy oci-archive:` read), reproducible: fixed timestamps, sorted entries,
uncompressed layer, so the same binary gives the same digest.

    scripts/oci-image.py --stage static --binary target/x86_64-unknown-linux-musl/release/hwaccel \
        --name ghcr.io/hwaccel/hwaccel-operator:0.1.0 --out target/image/hwaccel-static.oci.tar
"""

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

USER = "65532:65532"
ENTRYPOINT = ["/hwaccel"]
COMMON_LABELS = {
    "org.opencontainers.image.title": "hwaccel-operator",
    "org.opencontainers.image.source": "https://github.com/hwaccel/hwaccel-operator",
    "org.opencontainers.image.licenses": "Apache-2.0",
}
# `pause` and `busybox` are not product images: the real-node test tier's pod sandbox and
# client pods (tests/cluster/node.sh).
DESCRIPTIONS = {
    "pause": "The pod sandbox process of the hwaccel real-node test tier",
    "busybox": "busybox for the hwaccel real-node test tier's client pods",
    "static": "Finds every AI accelerator on every Kubernetes node and plans where models run on them",
    "glibc": "Finds every AI accelerator on every Kubernetes node and plans where models run on "
    "them (glibc build, loads NVML)",
}
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
GROUP = "root:x:0:\nnonroot:x:65532:\n"
# The OCI image spec's media types.
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def labels(stage):
    if stage in ("pause", "busybox"):
        return {"org.opencontainers.image.title": "hwaccel-test-" + stage}
    out = dict(COMMON_LABELS)
    out["org.opencontainers.image.description"] = DESCRIPTIONS[stage]
    return out


def shared_libraries(binary):
    """The absolute paths of the libraries `binary` loads, and its interpreter (from ldd)."""
    try:
        text = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        sys.exit(f"oci-image: ldd {binary} failed ({err}); the glibc image needs a dynamic binary")
    paths = []
    for line in text.splitlines():
        words = line.split()
        if "=>" in words:
            target = words[words.index("=>") + 1]
            if target.startswith("/"):
                paths.append(target)
        elif words and words[0].startswith("/"):
            paths.append(words[0])  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
    if not any("libc.so" in p for p in paths):
        sys.exit(f"oci-image: {binary} does not link glibc; build it for the *-linux-gnu target")
    return sorted(set(paths))


def add_file(tar, arcname, data, mode):
    info = tarfile.TarInfo(arcname)
    info.size = len(data)
    info.mode = mode
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar, arcname, mode=0o755):
    info = tarfile.TarInfo(arcname)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    info.mtime = EPOCH
    tar.addfile(info)


def add_symlink(tar, arcname, target):
    info = tarfile.TarInfo(arcname)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    info.mtime = EPOCH
    tar.addfile(info)


def entrypoint(stage):
    return {"pause": ["/pause"], "busybox": ["/bin/busybox"]}.get(stage, ENTRYPOINT)


def layer(stage, binary):
    """The image's one layer as uncompressed tar bytes."""
    files = {entrypoint(stage)[0].lstrip("/"): (open(binary, "rb").read(), 0o755)}
    files["etc/passwd"] = (PASSWD.encode(), 0o644)
    files["etc/group"] = (GROUP.encode(), 0o644)
    links = {}
    if stage == "glibc":
        for path in shared_libraries(binary):
            real = os.path.realpath(path)
            files[real.lstrip("/")] = (open(real, "rb").read(), 0o755)
            if real != path:
                links[path.lstrip("/")] = real
    dirs = set()
    for name in list(files) + list(links):
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    dirs.add("tmp")  # an empty /tmp, as distroless has (the root filesystem is read-only)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(dirs | set(files) | set(links)):
            if name in files:
                data, mode = files[name]
                add_file(tar, name, data, mode)
            elif name in links:
                # A link whose directory is itself a link on the build machine (/lib64 on
                # some distributions) is written as a plain link at the path ldd printed.
                add_symlink(tar, name, links[name])
            else:
                add_dir(tar, name, 0o1777 if name == "tmp" else 0o755)
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def architecture():
    """The build machine's architecture in OCI terms (the binaries are built for it)."""
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def build(stage, binary, name, out):
    layer_digest, layer_bytes = blob(layer(stage, binary))
    config = {
        "architecture": architecture(),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "User": USER,
            "Entrypoint": entrypoint(stage),
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "WorkingDir": "/",
            "Labels": labels(stage),
        },
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": f"scripts/oci-image.py --stage {stage}"}],
    }
    config_digest, config_bytes = blob(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": MT_LAYER, "digest": layer_digest, "size": len(layer_bytes)}],
        "annotations": {"org.opencontainers.image.title": labels(stage)["org.opencontainers.image.title"],
                        "hwaccel.io/stage": stage},
    }
    manifest_digest, manifest_bytes = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": MT_INDEX,
        "manifests": [
            {
                "mediaType": MT_MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                # Importers pick the manifest for their platform from the index.
                "platform": {"architecture": architecture(), "os": "linux"},
                "annotations": {
                    # containerd names the image from the first; the OCI layout's own tag is the second.
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644)
        add_file(tar, "index.json", json.dumps(index, sort_keys=True).encode(), 0o644)
        add_dir(tar, "blobs")
        add_dir(tar, "blobs/sha256")
        for digest, data in sorted([(layer_digest, layer_bytes), (config_digest, config_bytes),
                                    (manifest_digest, manifest_bytes)]):
            add_file(tar, "blobs/sha256/" + digest.split(":", 1)[1], data, 0o644)
    os.replace(tmp, out)
    print(f"{out}: {name} ({stage}) manifest {manifest_digest}, layer {len(layer_bytes) // 1024} KiB")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(DESCRIPTIONS), required=True)
    parser.add_argument("--binary", required=True, help="the binary to put at the entrypoint (/hwaccel)")
    parser.add_argument("--name", required=True, help="image reference, e.g. ghcr.io/hwaccel/hwaccel-operator:0.1.0")
    parser.add_argument("--out", required=True, help="the OCI archive to write")
    args = parser.parse_args()
    if not os.path.isfile(args.binary):
        sys.exit(f"oci-image: no binary at {args.binary}")
    build(args.stage, args.binary, args.name, args.out)


if __name__ == "__main__":
    main()
