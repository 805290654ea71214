//! `ProcessView`: where detection reads the facts of the *process* running it (is it in a
//! container, is it in Kubernetes), as opposed to the host's facts, which come from
//! [`HostRoot`].
//!
//! The two differ in the agent's pod: the host is mounted under `/host` (and the chart rightly
//! mounts no `/proc/self` and no service-account directory there), while the process's own
//! `/proc/self`, service-account mount and `KUBERNETES_SERVICE_HOST` are at `/` and in its
//! environment. Reading the process's facts under the host root made every in-pod inventory
//! say `kubernetes: false` with no `container` (issue 28).
//!
//! The view is a value, so tests inject it: a directory that stands for the process's own
//! root, and whether the environment names a Kubernetes service. Only [`ProcessView::own`]
//! reads the real environment, once, when it is made.

use std::path::Path;

use super::HostRoot;

/// Where the running process's own facts are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    /// The process's root directory: `/proc/self/cgroup`, `/proc/self/mountinfo`,
    /// `/proc/1/cgroup`, `/.dockerenv`, `/run/.containerenv`, the service-account mount.
    files: HostRoot,
    /// `KUBERNETES_SERVICE_HOST` is set (and not empty) in the process's environment.
    kubernetes_env: bool,
}

impl ProcessView {
    /// The process that is running: its files at `/`, its real environment (read now).
    pub fn own() -> Self {
        let kubernetes_env =
            std::env::var_os("KUBERNETES_SERVICE_HOST").is_some_and(|value| !value.is_empty());
        Self::new(HostRoot::new("/"), kubernetes_env)
    }

    /// A process whose root is `files` and whose environment does (or does not) name a
    /// Kubernetes service: for tests, and for fixture trees captured from a process.
    pub fn new(files: HostRoot, kubernetes_env: bool) -> Self {
        Self {
            files,
            kubernetes_env,
        }
    }

    /// The default for a detector over `host`: the running process when `host` is this
    /// machine's own root, otherwise the process a host tree was captured from (the tree
    /// itself, without an environment), so a fixture's report never depends on the shell
    /// that runs it. The agent, whose report describes the node it runs on from inside a
    /// pod, always uses [`ProcessView::own`] instead.
    pub fn for_host(host: &HostRoot) -> Self {
        if is_own_root(host.root()) {
            Self::own()
        } else {
            Self::new(host.fresh(), false)
        }
    }

    /// The process's files.
    pub fn files(&self) -> &HostRoot {
        &self.files
    }

    /// True when the environment names a Kubernetes service (`KUBERNETES_SERVICE_HOST`).
    pub fn kubernetes_env(&self) -> bool {
        self.kubernetes_env
    }

    /// The same view with nothing refused yet, for one detection run (see
    /// [`HostRoot::fresh`]).
    #[must_use]
    pub fn fresh(&self) -> Self {
        Self::new(self.files.fresh(), self.kubernetes_env)
    }
}

/// True when `root` is this machine's own root directory (`/`, `/.`). Decided from the path
/// alone, without a syscall.
pub fn is_own_root(root: &Path) -> bool {
    use std::path::Component;
    let mut components = root.components();
    components.next() == Some(Component::RootDir) && components.all(|c| c == Component::CurDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_slash_is_this_machine() {
        assert!(is_own_root(Path::new("/")));
        assert!(is_own_root(Path::new("/.")));
        assert!(!is_own_root(Path::new("/host")));
        assert!(!is_own_root(Path::new(".")));
        assert!(!is_own_root(Path::new("fixtures/hosts/cpu-only-vm")));
    }

    #[test]
    fn a_host_tree_stands_for_its_own_process_without_an_environment() {
        let tree = ProcessView::for_host(&HostRoot::new("fixtures/hosts/cpu-only-vm"));
        assert_eq!(tree.files().root(), Path::new("fixtures/hosts/cpu-only-vm"));
        assert!(!tree.kubernetes_env());
        // Root `/` is the running process (whatever its environment says).
        assert_eq!(
            ProcessView::for_host(&HostRoot::new("/")).files().root(),
            Path::new("/")
        );
    }
}
