//! The runtime environment: container, Kubernetes, cloud and instance type from DMI, kernel, OS.
//!
//! Sources, all read through [`HostRoot`]:
//! - Container: `/.dockerenv` (Docker), `/run/.containerenv` (Podman), the cgroup paths in
//!   `/proc/self/cgroup` then `/proc/1/cgroup` (`kubepods`, `docker-<id>.scope`,
//!   `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`...), and an `overlay`
//!   root filesystem in `/proc/self/mountinfo`.
//! - Kubernetes: a service-account mount (`/var/run/secrets/kubernetes.io/serviceaccount`),
//!   a `kubepods` cgroup, or `KUBERNETES_SERVICE_HOST` in the environment.
//! - Cloud and instance type: `/sys/class/dmi/id/{sys_vendor,product_name,board_vendor,
//!   bios_vendor,bios_version,chassis_asset_tag}`. Only EC2 puts the instance type there.
//! - Kernel: `/proc/sys/kernel/osrelease`; OS: `PRETTY_NAME` of `/etc/os-release` (or
//!   `/usr/lib/os-release`).
//!
//! The container and Kubernetes facts describe the *process* running detection, so they are
//! read from the context's [`ProcessView`](crate::detect::ProcessView), not from the host
//! root: in the agent's pod the host is mounted at `/host` without `/proc/self` or a
//! service-account directory, while the process's own are at `/` and in its environment.
//! For a fixture tree the view is the tree itself, without an environment (the tree describes
//! the process it was captured from), so fixtures never change with the shell running tests.
//! Cloud, instance type, kernel and OS are the host's and come from the host root.

use crate::detect::{Backend, Context, Findings, HostRoot};
use crate::hardware::RuntimeEnv;

/// The `runtime` backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Runtime;

impl Backend for Runtime {
    fn name(&self) -> &'static str {
        "runtime"
    }

    fn detect(&self, ctx: &Context) -> Findings {
        let host = ctx.host();
        let process = ctx.process();
        let own = process.files();
        let cgroups = ["/proc/self/cgroup", "/proc/1/cgroup"]
            .iter()
            .filter_map(|path| own.read(path))
            .map(|text| parse_cgroup_markers(&text))
            .fold(CgroupMarkers::default(), CgroupMarkers::or);
        let kubernetes = cgroups.kubepods
            || SERVICE_ACCOUNT_DIRS.iter().any(|dir| own.exists(dir))
            || process.kubernetes_env();
        let dmi = Dmi::read(host);
        let (cloud, instance_type) = cloud_from_dmi(&dmi);
        let runtime = RuntimeEnv {
            container: container_runtime(own, &cgroups).map(str::to_string),
            kubernetes,
            cloud: cloud.map(str::to_string),
            instance_type,
            kernel: host.read_trimmed("/proc/sys/kernel/osrelease"),
            os: ["/etc/os-release", "/usr/lib/os-release"]
                .iter()
                .find_map(|path| host.read(path))
                .and_then(|text| parse_os_release(&text)),
        };
        Findings {
            runtime: Some(runtime),
            ..Findings::default()
        }
    }
}

/// Where a pod's service-account token is mounted.
const SERVICE_ACCOUNT_DIRS: [&str; 2] = [
    "/var/run/secrets/kubernetes.io/serviceaccount",
    "/run/secrets/kubernetes.io/serviceaccount",
];

/// What cgroup paths say about a container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupMarkers {
    /// The runtime named by the path, if any.
    pub runtime: Option<&'static str>,
    /// True when the path is under a Kubernetes pod (`kubepods`).
    pub kubepods: bool,
}

impl CgroupMarkers {
    /// Combines two readings; the first runtime found wins.
    pub fn or(self, other: Self) -> Self {
        Self {
            runtime: self.runtime.or(other.runtime),
            kubepods: self.kubepods || other.kubepods,
        }
    }
}

/// Reads a `/proc/<pid>/cgroup` file for container runtimes' path conventions: systemd scopes
/// (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`)
/// and cgroupfs directories (`/docker/<id>`, `/lxc/<name>`, `/kubepods/...`).
pub fn parse_cgroup_markers(text: &str) -> CgroupMarkers {
    let mut markers = CgroupMarkers::default();
    for line in text.lines() {
        // `id:controllers:path`; the path may itself contain colons.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        markers.kubepods |= path.contains("kubepods");
        if markers.runtime.is_none() {
            markers.runtime = runtime_in_path(path);
        }
    }
    markers
}

fn runtime_in_path(path: &str) -> Option<&'static str> {
    const MARKERS: [(&str, &str); 8] = [
        ("libpod-", "podman"),
        ("/libpod_parent", "podman"),
        ("cri-containerd-", "containerd"),
        ("/containerd/", "containerd"),
        ("crio-", "cri-o"),
        ("docker-", "docker"),
        ("/docker/", "docker"),
        ("/lxc/", "lxc"),
    ];
    if let Some(&(_, runtime)) = MARKERS.iter().find(|(marker, _)| path.contains(marker)) {
        return Some(runtime);
    }
    // cgroupfs-driver pods (`/kubepods/burstable/pod<uid>/<id>`) do not name the runtime.
    path.contains("kubepods").then_some("kubepods")
}

/// The container runtime of the process whose root is `own`: marker files first (they name the runtime for sure), then cgroup
/// paths, then an overlay root filesystem, which shows a container without naming it.
fn container_runtime(own: &HostRoot, cgroups: &CgroupMarkers) -> Option<&'static str> {
    if own.exists("/run/.containerenv") {
        return Some("podman");
    }
    if own.exists("/.dockerenv") {
        return Some("docker");
    }
    if cgroups.runtime.is_some() {
        return cgroups.runtime;
    }
    own.read("/proc/self/mountinfo")
        .filter(|text| root_is_overlay(text))
        .map(|_| "unknown")
}

/// True when `/proc/self/mountinfo` shows `/` mounted from an overlay filesystem, the way
/// container runtimes assemble image layers.
pub fn root_is_overlay(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        // `id parent major:minor root mountpoint options [optional...] - fstype source super`
        let Some((before, after)) = line.split_once(" - ") else {
            return false;
        };
        let mount_point = before.split_ascii_whitespace().nth(4);
        let fs_type = after.split_ascii_whitespace().next();
        mount_point == Some("/") && matches!(fs_type, Some("overlay" | "fuse-overlayfs"))
    })
}

/// The DMI identity strings that clouds fill in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dmi {
    /// `sys_vendor`.
    pub sys_vendor: Option<String>,
    /// `product_name`.
    pub product_name: Option<String>,
    /// `board_vendor`.
    pub board_vendor: Option<String>,
    /// `bios_vendor`.
    pub bios_vendor: Option<String>,
    /// `bios_version`.
    pub bios_version: Option<String>,
    /// `chassis_asset_tag`.
    pub chassis_asset_tag: Option<String>,
}

impl Dmi {
    /// Reads `/sys/class/dmi/id/*`.
    pub fn read(host: &HostRoot) -> Self {
        let field = |name: &str| host.read_trimmed(format!("/sys/class/dmi/id/{name}"));
        Self {
            sys_vendor: field("sys_vendor"),
            product_name: field("product_name"),
            board_vendor: field("board_vendor"),
            bios_vendor: field("bios_vendor"),
            bios_version: field("bios_version"),
            chassis_asset_tag: field("chassis_asset_tag"),
        }
    }
}

/// Azure stamps every VM's chassis with this asset tag; plain Hyper-V has the same vendor
/// strings but not the tag.
const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";

/// The cloud provider and, where DMI holds it, the instance type.
pub fn cloud_from_dmi(dmi: &Dmi) -> (Option<&'static str>, Option<String>) {
    let is = |field: &Option<String>, value: &str| field.as_deref() == Some(value);
    let starts = |field: &Option<String>, prefix: &str| {
        field.as_deref().is_some_and(|v| v.starts_with(prefix))
    };
    let vendor = |value: &str| is(&dmi.sys_vendor, value);

    let aws_nitro = vendor("Amazon EC2")
        || is(&dmi.board_vendor, "Amazon EC2")
        || is(&dmi.bios_vendor, "Amazon EC2");
    // Xen-era instances say `Xen`/`HVM domU` and only the BIOS version mentions Amazon.
    let aws_xen = dmi
        .bios_version
        .as_deref()
        .is_some_and(|v| v.to_ascii_lowercase().contains("amazon"));
    if aws_nitro || aws_xen {
        let instance_type = dmi
            .product_name
            .as_deref()
            .filter(|_| aws_nitro)
            .filter(|name| looks_like_instance_type(name))
            .map(str::to_string);
        return (Some("aws"), instance_type);
    }
    let tag = &dmi.chassis_asset_tag;
    let cloud = if vendor("Google") || is(&dmi.product_name, "Google Compute Engine") {
        "gcp"
    } else if is(tag, AZURE_ASSET_TAG) {
        "azure"
    } else if is(tag, "OracleCloud.com") {
        "oci"
    } else if vendor("Alibaba Cloud") || starts(&dmi.product_name, "Alibaba Cloud ECS") {
        "alibaba"
    } else if vendor("Tencent Cloud") {
        "tencent"
    } else if is(tag, "HUAWEICLOUD") {
        "huawei"
    } else if vendor("DigitalOcean") {
        "digitalocean"
    } else if vendor("Hetzner") {
        "hetzner"
    } else if vendor("Linode") || vendor("Akamai") {
        "akamai"
    } else if vendor("Vultr") {
        "vultr"
    } else if vendor("Scaleway") {
        "scaleway"
    } else if vendor("UpCloud") {
        "upcloud"
    } else if is(&dmi.product_name, "Exoscale") || vendor("Exoscale") {
        "exoscale"
    } else if starts(&dmi.product_name, "OpenStack")
        || is(tag, "OpenTelekomCloud")
        || is(tag, "SAP CCloud VM")
    {
        "openstack"
    } else {
        return (None, None);
    };
    (Some(cloud), None)
}

/// EC2 instance types are `family.size` (`p5.48xlarge`, `m7i.2xlarge`, `u-6tb1.metal`).
fn looks_like_instance_type(name: &str) -> bool {
    let Some((family, size)) = name.split_once('.') else {
        return false;
    };
    let allowed =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    allowed(family) && allowed(size)
}

/// `PRETTY_NAME` from os-release, unquoted; `NAME VERSION` when it is absent.
pub fn parse_os_release(text: &str) -> Option<String> {
    let value = |key: &str| {
        text.lines().find_map(|line| {
            let (name, value) = line.trim().split_once('=')?;
            (name.trim() == key)
                .then(|| unquote(value.trim()))
                .filter(|v| !v.is_empty())
        })
    };
    value("PRETTY_NAME").or_else(|| {
        let name = value("NAME")?;
        Some(match value("VERSION") {
            Some(version) => format!("{name} {version}"),
            None => name,
        })
    })
}

/// Shell-style unquoting as os-release allows: double quotes with backslash escapes, or
/// single quotes taken literally.
fn unquote(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.to_string();
    }
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        return value.to_string();
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\'
            && let Some(escaped) = chars.next()
        {
            out.push(escaped);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::detect_on;
    use crate::detect::testing::write_host_file as write;
    use crate::detect::{CommandRunner, Context, ProcessView};
    use proptest::prelude::*;
    use std::path::Path;

    fn detect_in(root: &Path) -> RuntimeEnv {
        let ctx = Context::new(HostRoot::new(root), CommandRunner::new(Vec::new()));
        Runtime.detect(&ctx).runtime.unwrap()
    }

    fn dmi(vendor: &str, product: &str, tag: &str) -> Dmi {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Dmi {
            sys_vendor: some(vendor),
            product_name: some(product),
            chassis_asset_tag: some(tag),
            ..Dmi::default()
        }
    }

    #[test]
    fn detects_the_fixture_vm() {
        let runtime = detect_on(&Runtime, "cpu-only-vm").runtime.unwrap();
        assert_eq!(
            runtime,
            RuntimeEnv {
                container: None,
                kubernetes: false,
                cloud: Some("aws".into()),
                instance_type: Some("m7i.2xlarge".into()),
                kernel: Some("6.8.0-1021-aws".into()),
                // Read through the fixture's `etc/os-release -> ../usr/lib/os-release` link.
                os: Some("Ubuntu 24.04.1 LTS".into()),
            }
        );
    }

    #[test]
    fn names_clouds_from_dmi() {
        let cases = [
            (
                dmi("Amazon EC2", "p5.48xlarge", "Amazon EC2"),
                Some("aws"),
                Some("p5.48xlarge"),
            ),
            (dmi("Amazon EC2", "Not Specified", ""), Some("aws"), None),
            (
                dmi("Google", "Google Compute Engine", ""),
                Some("gcp"),
                None,
            ),
            (
                dmi("Microsoft Corporation", "Virtual Machine", AZURE_ASSET_TAG),
                Some("azure"),
                None,
            ),
            (
                dmi("Microsoft Corporation", "Virtual Machine", "None"),
                None,
                None,
            ),
            (
                dmi(
                    "QEMU",
                    "Standard PC (i440FX + PIIX, 1996)",
                    "OracleCloud.com",
                ),
                Some("oci"),
                None,
            ),
            (
                dmi("Alibaba Cloud", "Alibaba Cloud ECS", ""),
                Some("alibaba"),
                None,
            ),
            (dmi("Hetzner", "vServer", ""), Some("hetzner"), None),
            (
                dmi("OpenStack Foundation", "OpenStack Nova", ""),
                Some("openstack"),
                None,
            ),
            (dmi("Dell Inc.", "PowerEdge XE9680", ""), None, None),
        ];
        for (dmi, cloud, instance) in cases {
            let (found, instance_type) = cloud_from_dmi(&dmi);
            assert_eq!(found, cloud, "{dmi:?}");
            assert_eq!(instance_type.as_deref(), instance, "{dmi:?}");
        }
        let xen = Dmi {
            sys_vendor: Some("Xen".into()),
            product_name: Some("HVM domU".into()),
            bios_version: Some("4.11.amazon".into()),
            ..Dmi::default()
        };
        assert_eq!(cloud_from_dmi(&xen), (Some("aws"), None));
    }

    #[test]
    fn reads_container_runtimes_from_cgroup_paths() {
        let k8s = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f1e.slice/\
cri-containerd-4a5b6c.scope\n";
        assert_eq!(
            parse_cgroup_markers(k8s),
            CgroupMarkers {
                runtime: Some("containerd"),
                kubepods: true
            }
        );
        let cgroupfs_pod = "11:memory:/kubepods/burstable/pod0f1e/4a5b6c\n";
        assert_eq!(parse_cgroup_markers(cgroupfs_pod).runtime, Some("kubepods"));
        let docker = "0::/system.slice/docker-4a5b6c.scope\n";
        assert_eq!(parse_cgroup_markers(docker).runtime, Some("docker"));
        let v1_docker = "12:cpu,cpuacct:/docker/4a5b6c\n";
        assert_eq!(parse_cgroup_markers(v1_docker).runtime, Some("docker"));
        let podman =
            "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-4a5b.scope\n";
        assert_eq!(parse_cgroup_markers(podman).runtime, Some("podman"));
        let host = "0::/user.slice/user-1000.slice/session-3.scope\n";
        assert_eq!(parse_cgroup_markers(host), CgroupMarkers::default());
        // The docker daemon's own service is not a container.
        assert_eq!(
            parse_cgroup_markers("0::/system.slice/docker.service\n").runtime,
            None
        );
    }

    #[test]
    fn sees_an_overlay_root() {
        let container = "1046 955 0:113 / / rw,relatime master:341 - overlay overlay \
rw,lowerdir=/var/lib/containerd/l1,upperdir=/u,workdir=/w\n";
        assert!(root_is_overlay(container));
        let vm = include_str!("../../../../fixtures/hosts/cpu-only-vm/proc/self/mountinfo");
        assert!(!root_is_overlay(vm));
        assert!(!root_is_overlay("garbage - overlay\n"));
    }

    #[test]
    fn parses_os_release() {
        let ubuntu = include_str!("../../../../fixtures/hosts/cpu-only-vm/usr/lib/os-release");
        assert_eq!(
            parse_os_release(ubuntu).as_deref(),
            Some("Ubuntu 24.04.1 LTS")
        );
        assert_eq!(
            parse_os_release("NAME='Rocky Linux'\nVERSION=\"9.4 (Blue Onyx)\"\n").as_deref(),
            Some("Rocky Linux 9.4 (Blue Onyx)")
        );
        assert_eq!(
            parse_os_release("PRETTY_NAME=\"Say \\\"hi\\\"\"\n").as_deref(),
            Some("Say \"hi\"")
        );
        assert_eq!(parse_os_release("ID=arch\n"), None);
    }

    #[test]
    fn a_pod_on_a_cloud_node() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "proc/self/cgroup",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n",
        );
        write(
            root,
            "var/run/secrets/kubernetes.io/serviceaccount/token",
            "x",
        );
        write(root, "sys/class/dmi/id/sys_vendor", "Google\n");
        write(
            root,
            "sys/class/dmi/id/product_name",
            "Google Compute Engine\n",
        );
        let runtime = detect_in(root);
        assert_eq!(runtime.container.as_deref(), Some("containerd"));
        assert!(runtime.kubernetes);
        assert_eq!(runtime.cloud.as_deref(), Some("gcp"));
        assert_eq!(runtime.instance_type, None);
    }

    #[test]
    fn marker_files_name_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), ".dockerenv", "");
        write(
            dir.path(),
            "proc/self/mountinfo",
            "1 0 0:1 / / rw - overlay overlay rw\n",
        );
        assert_eq!(detect_in(dir.path()).container.as_deref(), Some("docker"));
        write(dir.path(), "run/.containerenv", "engine=\"podman-4.9.3\"\n");
        assert_eq!(detect_in(dir.path()).container.as_deref(), Some("podman"));
    }

    #[test]
    fn an_unnamed_container_is_still_a_container() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "proc/self/cgroup", "0::/\n");
        write(
            dir.path(),
            "proc/self/mountinfo",
            "1 0 0:1 / / rw - overlay overlay rw\n",
        );
        assert_eq!(detect_in(dir.path()).container.as_deref(), Some("unknown"));
    }

    /// A pod's own root, as the agent's process sees it: its cgroup, its service-account
    /// mount, an overlay root.
    fn pod_process_root(root: &Path) {
        write(
            root,
            "proc/self/cgroup",
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n",
        );
        write(
            root,
            "proc/self/mountinfo",
            "1 0 0:1 / / rw - overlay overlay rw\n",
        );
        write(
            root,
            "var/run/secrets/kubernetes.io/serviceaccount/token",
            "x",
        );
    }

    fn detect_with(host: &Path, process: ProcessView) -> RuntimeEnv {
        let ctx =
            Context::new(HostRoot::new(host), CommandRunner::new(Vec::new())).with_process(process);
        Runtime.detect(&ctx).runtime.unwrap()
    }

    /// Issue 28: the agent reads the host at `/host`, which has no `/proc/self` and no
    /// service-account directory; the process's own facts still say pod and container,
    /// while the host's facts (cloud, OS) still come from the host root.
    #[test]
    fn process_facts_come_from_the_process_whatever_the_host_root() {
        let host = tempfile::tempdir().unwrap();
        write(host.path(), "sys/class/dmi/id/sys_vendor", "Google\n");
        write(host.path(), "etc/os-release", "PRETTY_NAME=\"Host OS\"\n");
        let pod = tempfile::tempdir().unwrap();
        pod_process_root(pod.path());
        write(pod.path(), "etc/os-release", "PRETTY_NAME=\"Image OS\"\n");
        let runtime = detect_with(
            host.path(),
            ProcessView::new(HostRoot::new(pod.path()), false),
        );
        assert!(runtime.kubernetes);
        assert_eq!(runtime.container.as_deref(), Some("containerd"));
        assert_eq!(runtime.cloud.as_deref(), Some("gcp"));
        assert_eq!(runtime.os.as_deref(), Some("Host OS"));
        // The same host read as its own process (the old reading) saw neither.
        let old = detect_in(host.path());
        assert!(!old.kubernetes);
        assert_eq!(old.container, None);
    }

    /// A cgroup namespace hides the `kubepods` path (`0::/`) and a pod may run without a token
    /// (`automountServiceAccountToken: false`); `KUBERNETES_SERVICE_HOST` still says
    /// Kubernetes, and the overlay root still says container.
    #[test]
    fn the_environment_says_kubernetes_when_the_files_do_not() {
        let host = tempfile::tempdir().unwrap();
        let pod = tempfile::tempdir().unwrap();
        write(pod.path(), "proc/self/cgroup", "0::/\n");
        write(
            pod.path(),
            "proc/self/mountinfo",
            "1 0 0:1 / / rw - overlay overlay rw\n",
        );
        let files = || HostRoot::new(pod.path());
        let with_env = detect_with(host.path(), ProcessView::new(files(), true));
        assert!(with_env.kubernetes);
        assert_eq!(with_env.container.as_deref(), Some("unknown"));
        assert!(!detect_with(host.path(), ProcessView::new(files(), false)).kubernetes);
    }

    /// The host tree's own markers say nothing about the process once the process is elsewhere.
    #[test]
    fn host_markers_are_not_the_process() {
        let host = tempfile::tempdir().unwrap();
        write(host.path(), ".dockerenv", "");
        pod_process_root(host.path());
        let bare = tempfile::tempdir().unwrap();
        let runtime = detect_with(
            host.path(),
            ProcessView::new(HostRoot::new(bare.path()), false),
        );
        assert_eq!(runtime.container, None);
        assert!(!runtime.kubernetes);
    }

    #[test]
    fn a_missing_host_is_an_empty_environment() {
        assert_eq!(
            detect_in(Path::new("/nonexistent/host")),
            RuntimeEnv::default()
        );
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in ".*") {
            let _ = parse_cgroup_markers(&s);
            let _ = root_is_overlay(&s);
            let _ = parse_os_release(&s);
            let _ = looks_like_instance_type(&s);
            let _ = cloud_from_dmi(&Dmi { product_name: Some(s.clone()), ..Dmi::default() });
        }

        #[test]
        fn parsers_never_panic_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let s = String::from_utf8_lossy(&bytes);
            let _ = parse_cgroup_markers(&s);
            let _ = root_is_overlay(&s);
            let _ = parse_os_release(&s);
        }
    }
}
