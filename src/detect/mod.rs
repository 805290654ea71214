//! Accelerator detection: backends that each know one kind of hardware, run concurrently over
//! a host view, merged into one deterministic [`Report`].
//!
//! A backend never touches the host directly. It reads files through [`HostRoot`] and runs
//! tools through [`CommandRunner`], so the same code runs on a bare machine (`/`), in the
//! agent's pod (`/host`), and against fixture trees in tests. Detection is best effort and
//! never fatal: a missing tool is silent, a failing one becomes a warning, and a backend that
//! panics is reported as a warning too.

pub mod backends;
mod command;
mod host;
pub mod pci;
pub mod render;
mod report;
mod selection;
#[cfg(test)]
pub mod testing;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Instant;

pub use command::{
    CommandError, CommandOutput, CommandRunner, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT,
};
pub use host::{HostRoot, parse_u64};
pub use pci::PciFunction;
pub use report::{BackendRun, BackendTiming, Findings, Report, SCHEMA_VERSION, Warning, merge};
pub use selection::{BackendSelection, SelectionError};

/// What a backend gets to look at.
#[derive(Debug)]
pub struct Context {
    host: HostRoot,
    runner: CommandRunner,
    pci: OnceLock<Vec<PciFunction>>,
}

impl Context {
    /// A context over a host view and a command runner.
    pub fn new(host: HostRoot, runner: CommandRunner) -> Self {
        Self {
            host,
            runner,
            pci: OnceLock::new(),
        }
    }

    /// The host's files.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }

    /// The host's tools.
    pub fn runner(&self) -> &CommandRunner {
        &self.runner
    }

    /// The PCI functions of the host, scanned once on first use and shared by all backends.
    pub fn pci(&self) -> &[PciFunction] {
        self.pci.get_or_init(|| pci::scan(&self.host))
    }

    /// PCI functions of one vendor.
    pub fn pci_by_vendor(&self, vendor: u16) -> impl Iterator<Item = &PciFunction> {
        self.pci().iter().filter(move |f| f.vendor == vendor)
    }

    /// Runs a tool; a missing tool gives `Ok(None)`, any other failure an error to report.
    pub fn run_tool(
        &self,
        tool: &str,
        args: &[&str],
    ) -> Result<Option<CommandOutput>, CommandError> {
        match self.runner.run(tool, args) {
            Ok(output) => Ok(Some(output)),
            Err(err) if err.is_not_found() => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// One kind of hardware detection.
pub trait Backend: Send + Sync {
    /// Short stable name, used in `--backends`, warnings and metrics (`nvidia`, `intel-gpu`).
    fn name(&self) -> &'static str;

    /// Looks at the host and reports what it finds. Must not panic on any input (a panic is
    /// caught and reported, but it loses that backend's findings).
    fn detect(&self, ctx: &Context) -> Findings;
}

/// Runs a set of backends over one host.
///
/// A detector can run many times (the agent keeps one); each run gets a fresh [`Context`], so
/// nothing read from the host — the PCI scan above all — outlives the run that read it.
pub struct Detector {
    backends: Vec<Box<dyn Backend>>,
    host: HostRoot,
    runner: CommandRunner,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.backends.iter().map(|b| b.name()).collect();
        f.debug_struct("Detector")
            .field("backends", &names)
            .field("host", &self.host)
            .field("runner", &self.runner)
            .finish()
    }
}

impl Detector {
    /// A detector with the selected built-in backends.
    pub fn new(host: HostRoot, runner: CommandRunner, selection: &BackendSelection) -> Self {
        let backends = backends::all()
            .into_iter()
            .filter(|b| selection.includes(b.name()))
            .collect();
        Self::with_backends(host, runner, backends)
    }

    /// A detector with explicit backends, in priority order (earlier wins duplicate devices).
    pub fn with_backends(
        host: HostRoot,
        runner: CommandRunner,
        backends: Vec<Box<dyn Backend>>,
    ) -> Self {
        Self {
            backends,
            host,
            runner,
        }
    }

    /// Runs every backend concurrently and merges their findings. Per-backend timings are
    /// always returned; they go into the report only when `with_timings`.
    ///
    /// Backends are taken in order by at most [`MAX_WORKERS`] threads, the caller's included,
    /// rather than one thread each: on a host without their hardware most backends return in
    /// microseconds, less than it costs to start a thread, while the few that wait on a slow
    /// tool still overlap with each other and with the rest.
    pub fn run(&self, with_timings: bool) -> (Report, Vec<BackendTiming>) {
        let context = Context::new(self.host.clone(), self.runner.clone());
        let next = AtomicUsize::new(0);
        let work = || {
            let mut done = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(backend) = self.backends.get(index) else {
                    return done;
                };
                done.push((index, run_one(backend.as_ref(), &context)));
            }
        };
        let workers = self.backends.len().clamp(1, MAX_WORKERS);
        let mut finished: Vec<(usize, BackendRun)> = thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers).map(|_| scope.spawn(work)).collect();
            let mut all = work();
            for helper in helpers {
                // `run_one` catches backend panics; a helper that died anyway loses its
                // backends' findings, which are reported as failed below.
                all.extend(helper.join().unwrap_or_default());
            }
            all
        });
        finished.sort_by_key(|(index, _)| *index);
        let mut finished = finished.into_iter().peekable();
        let runs: Vec<BackendRun> = self
            .backends
            .iter()
            .enumerate()
            .map(|(index, backend)| {
                finished
                    .next_if(|(done, _)| *done == index)
                    .map(|(_, run)| run)
                    .unwrap_or_else(|| BackendRun {
                        backend: backend.name(),
                        findings: Findings::warning("backend thread failed"),
                        elapsed: std::time::Duration::ZERO,
                    })
            })
            .collect();
        let timings = runs
            .iter()
            .map(|run| BackendTiming {
                backend: run.backend.to_string(),
                micros: u64::try_from(run.elapsed.as_micros()).unwrap_or(u64::MAX),
            })
            .collect();
        (merge(runs, with_timings), timings)
    }
}

/// Most threads a detection run uses, the caller's included.
pub const MAX_WORKERS: usize = 4;

fn run_one(backend: &dyn Backend, context: &Context) -> BackendRun {
    let started = Instant::now();
    let findings =
        catch_unwind(AssertUnwindSafe(|| backend.detect(context))).unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Findings::warning(format!("backend failed unexpectedly: {what}"))
        });
    let mut findings = findings;
    // Bus facts are the same for every PCI backend; fill the gaps once here.
    for device in &mut findings.devices {
        pci::fill_bus_facts(context.host(), device);
    }
    BackendRun {
        backend: backend.name(),
        findings,
        elapsed: started.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::{Device, Family, Vendor};

    struct Fixed(&'static str, Vec<&'static str>);
    impl Backend for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn detect(&self, _: &Context) -> Findings {
            let devices = self
                .1
                .iter()
                .map(|id| Device::new(*id, Vendor::Nvidia, Family::Gpu, "GPU", self.0))
                .collect();
            Findings {
                devices,
                ..Findings::default()
            }
        }
    }

    struct Panics;
    impl Backend for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }
        fn detect(&self, _: &Context) -> Findings {
            panic!("parser bug")
        }
    }

    struct CountsPci;
    impl Backend for CountsPci {
        fn name(&self) -> &'static str {
            "counts-pci"
        }
        fn detect(&self, ctx: &Context) -> Findings {
            ctx.pci()
                .iter()
                .map(|f| Device::new(&f.address, Vendor::Other, Family::Asic, "x", "counts-pci"))
                .fold(Findings::default(), |mut findings, device| {
                    findings.devices.push(device);
                    findings
                })
        }
    }

    struct Sleeps(&'static str);
    impl Backend for Sleeps {
        fn name(&self) -> &'static str {
            self.0
        }
        fn detect(&self, _: &Context) -> Findings {
            thread::sleep(std::time::Duration::from_millis(300));
            Findings::warning(self.0)
        }
    }

    #[test]
    fn every_run_rescans_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let function = dir.path().join("sys/bus/pci/devices/0000:01:00.0");
        std::fs::create_dir_all(&function).unwrap();
        std::fs::write(function.join("vendor"), "0x1e52\n").unwrap();
        std::fs::write(function.join("class"), "0x120000\n").unwrap();
        let detector = Detector::with_backends(
            HostRoot::new(dir.path()),
            CommandRunner::new(Vec::new()),
            vec![Box::new(CountsPci)],
        );
        assert_eq!(detector.run(false).0.devices.len(), 1);
        std::fs::remove_dir_all(&function).unwrap();
        assert_eq!(detector.run(false).0.devices.len(), 0);
    }

    #[test]
    fn slow_backends_overlap_and_priority_order_is_kept() {
        let mut backends: Vec<Box<dyn Backend>> = vec![
            Box::new(Sleeps("slow-a")),
            Box::new(Fixed("fast-a", vec!["0000:01:00.0"])),
            Box::new(Sleeps("slow-b")),
        ];
        let names = ["f1", "f2", "f3", "f4", "f5", "f6", "f7", "f8", "f9"];
        backends.extend(names.map(|name| Box::new(Fixed(name, vec!["0000:01:00.0"])) as _));
        backends.push(Box::new(Sleeps("slow-c")));
        let detector = Detector::with_backends(
            HostRoot::new("/nonexistent"),
            CommandRunner::new(Vec::new()),
            backends,
        );
        let started = Instant::now();
        let (report, timings) = detector.run(false);
        // Run one after another, the three sleepers would take 900 ms.
        assert!(started.elapsed() < std::time::Duration::from_millis(800));
        let order: Vec<_> = timings.iter().map(|t| t.backend.as_str()).collect();
        assert_eq!(order, report.backends);
        assert_eq!(order[..3], ["slow-a", "fast-a", "slow-b"]);
        assert_eq!(order.last(), Some(&"slow-c"));
        // The first backend in priority order keeps the duplicated device.
        assert_eq!(report.devices[0].backend, "fast-a");
        assert_eq!(report.warnings.len(), 3);
    }

    #[test]
    fn a_panicking_backend_becomes_a_warning() {
        let detector = Detector::with_backends(
            HostRoot::new("/nonexistent"),
            CommandRunner::new(Vec::new()),
            vec![Box::new(Fixed("a", vec!["0000:01:00.0"])), Box::new(Panics)],
        );
        let (report, timings) = detector.run(false);
        assert_eq!(report.devices.len(), 1);
        assert_eq!(report.warnings.len(), 1);
        assert!(report.warnings[0].message.contains("parser bug"));
        assert_eq!(timings.len(), 2);
        assert_eq!(report.backends, ["a", "panics"]);
    }
}
