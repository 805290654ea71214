//! Accelerator detection: backends that each know one kind of hardware, run concurrently over
//! a host view, merged into one deterministic [`Report`].
//!
//! A backend never touches the host directly. It reads files through [`HostRoot`] and runs
//! tools through [`CommandRunner`], so the same code runs on a bare machine (`/`), in the
//! agent's pod (`/host`), and against fixture trees in tests. Detection is best effort and
//! never fatal: a missing tool is silent, a failing one becomes a warning, and a backend that
//! panics is reported as a warning too.
//!
//! Here: [`Detector`], [`Context`] and the [`Backend`] trait. [`HostRoot`] (`host.rs`) and
//! [`CommandRunner`] (`command.rs`) are the only ways to the host; [`pci`] is the PCI scan the
//! context shares. The backends are in [`backends`]: one registry table, `accelerators/` (one
//! backend per family), `node/` (cpu, topology, runtime) and `shared/` helpers.

pub mod backends;
mod command;
mod host;
pub mod pci;
mod process;
pub mod render;
mod report;
mod selection;
#[cfg(test)]
pub mod testing;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::Instant;

pub use command::{
    CommandError, CommandOutput, CommandRunner, DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT,
    kill_running_tools,
};
pub use host::{FileReadError, HostRoot, parse_u64, read_at_most};
pub use pci::PciFunction;
pub use process::ProcessView;
pub use report::{BackendRun, Findings, merge};
// The report is `hardware`'s; detection is what makes one, so its paths stay here too.
pub use crate::hardware::{BackendTiming, Report, SCHEMA_VERSION, Warning};
pub use selection::{BackendSelection, SelectionError};

/// What a backend gets to look at.
#[derive(Debug)]
pub struct Context {
    host: HostRoot,
    /// The running process's own facts; not the host's (see [`ProcessView`]).
    process: ProcessView,
    runner: CommandRunner,
    pci: OnceLock<Vec<PciFunction>>,
    /// The backends still to run, while a [`Detector`] runs over this context.
    crew: Mutex<Option<Arc<Crew>>>,
}

impl Context {
    /// A context over a host view and a command runner; the process's facts come from
    /// [`ProcessView::for_host`] unless [`Context::with_process`] says otherwise.
    pub fn new(host: HostRoot, runner: CommandRunner) -> Self {
        Self {
            process: ProcessView::for_host(&host),
            host,
            runner,
            pci: OnceLock::new(),
            crew: Mutex::new(None),
        }
    }

    /// The same context with the process's facts read from `process`.
    #[must_use]
    pub fn with_process(mut self, process: ProcessView) -> Self {
        self.process = process;
        self
    }

    /// The host's files.
    pub fn host(&self) -> &HostRoot {
        &self.host
    }

    /// The running process's own facts (container, Kubernetes), which the host root does not
    /// hold in the agent's pod.
    pub fn process(&self) -> &ProcessView {
        &self.process
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
    ///
    /// Backends must run tools through here rather than through [`Context::runner`]: while
    /// this thread waits for the tool, another thread takes over the backends still queued.
    pub fn run_tool(
        &self,
        tool: &str,
        args: &[&str],
    ) -> Result<Option<CommandOutput>, CommandError> {
        let Some(program) = self.runner.find(tool) else {
            return Ok(None);
        };
        let crew = lock(&self.crew).clone();
        if let Some(crew) = crew {
            crew.add_helper();
        }
        self.runner.run_program(tool, &program, args).map(Some)
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
pub struct Detector {
    backends: Arc<[Box<dyn Backend>]>,
    host: HostRoot,
    /// Where the process's own facts come from; `None` is [`ProcessView::for_host`].
    process: Option<ProcessView>,
    runner: CommandRunner,
}

impl std::fmt::Debug for Detector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.backends.iter().map(|b| b.name()).collect();
        f.debug_struct("Detector")
            .field("backends", &names)
            .field("host", &self.host)
            .field("process", &self.process)
            .field("runner", &self.runner)
            .finish()
    }
}

impl Detector {
    /// A detector with the selected built-in backends.
    pub fn new(host: HostRoot, runner: CommandRunner, selection: &BackendSelection) -> Self {
        Self::with_backends(host, runner, backends::selected(selection))
    }

    /// A detector with explicit backends, in priority order (earlier wins duplicate devices).
    pub fn with_backends(
        host: HostRoot,
        runner: CommandRunner,
        backends: Vec<Box<dyn Backend>>,
    ) -> Self {
        Self {
            backends: backends.into(),
            host,
            process: None,
            runner,
        }
    }

    /// The same detector, reading the process's own facts from `process` whatever the host
    /// root: the agent reads the host under `/host` but is itself the process in the pod.
    #[must_use]
    pub fn with_process(mut self, process: ProcessView) -> Self {
        self.process = Some(process);
        self
    }

    /// The names of the backends this detector runs, in priority order: the only backends
    /// whose devices a later run can see again.
    pub fn backend_names(&self) -> Vec<&'static str> {
        self.backends.iter().map(|b| b.name()).collect()
    }

    /// Runs every backend and merges their findings. Per-backend timings are always returned;
    /// they go into the report only when `with_timings`.
    ///
    /// The calling thread takes the backends in order. A thread costs more to start than most
    /// backends take on a host without their hardware, so no thread is started until a backend
    /// is about to wait on a tool: then a helper takes over the rest of the queue (and may
    /// hand it on the same way), so slow tools still overlap with each other and with the
    /// sysfs-only backends.
    ///
    /// Each run gets a fresh [`Context`], so nothing read from the host (the PCI scan above
    /// all) outlives the run that read it: the agent keeps one detector for its lifetime.
    pub fn run(&self, with_timings: bool) -> (Report, Vec<BackendTiming>) {
        let (context, crew) = self.start();
        drive(&context, &crew);
        self.collect(&context, &crew, with_timings, None)
    }

    /// [`Self::run`] with an overall deadline, for a caller that must answer (`hwaccel
    /// detect`). The run goes on a thread of its own; past `deadline` the report holds what
    /// the finished backends found and a warning for each backend that did not finish. A
    /// read that never returns (a hung NFS or FUSE mount under the host tree) cannot be
    /// interrupted: its thread is left behind, for the process's exit to end.
    ///
    /// The third value is false when the deadline passed: threads are then left behind, and
    /// a caller about to exit should not wait for anything they may hold (`hwaccel detect`
    /// exits at once, killing the tools still running).
    pub fn run_within(
        &self,
        with_timings: bool,
        deadline: std::time::Duration,
    ) -> (Report, Vec<BackendTiming>, bool) {
        let (context, crew) = self.start();
        let (done, finished) = std::sync::mpsc::channel();
        let (run_context, run_crew) = (Arc::clone(&context), Arc::clone(&crew));
        let spawned = thread::Builder::new()
            .name("hwaccel-detect".into())
            .spawn(move || {
                drive(&run_context, &run_crew);
                let _ = done.send(());
            });
        let in_time = match spawned {
            Ok(_) => finished.recv_timeout(deadline).is_ok(),
            // No thread to spare: run here, without a deadline, as `run` does.
            Err(_) => {
                drive(&context, &crew);
                true
            }
        };
        let (report, timings) = self.collect(
            &context,
            &crew,
            with_timings,
            (!in_time).then_some(deadline),
        );
        (report, timings, in_time)
    }

    /// A fresh context and backend queue for one run.
    fn start(&self) -> (Arc<Context>, Arc<Crew>) {
        let mut context = Context::new(self.host.fresh(), self.runner.clone());
        if let Some(process) = &self.process {
            context = context.with_process(process.fresh());
        }
        let context = Arc::new(context);
        let crew = Arc::new(Crew {
            backends: Arc::clone(&self.backends),
            context: Arc::downgrade(&context),
            next: AtomicUsize::new(0),
            helpers_started: AtomicUsize::new(0),
            helpers: Mutex::new(Vec::new()),
            finished: Mutex::new(Vec::new()),
        });
        *lock(&context.crew) = Some(Arc::clone(&crew));
        (context, crew)
    }

    /// The report of the backends that finished; each other one is a warning, saying the
    /// run's `deadline` passed when there was one, else that its thread failed.
    fn collect(
        &self,
        context: &Context,
        crew: &Crew,
        with_timings: bool,
        deadline: Option<std::time::Duration>,
    ) -> (Report, Vec<BackendTiming>) {
        let mut finished = std::mem::take(&mut *lock(&crew.finished));
        finished.sort_by_key(|(index, _)| *index);
        let mut finished = finished.into_iter().peekable();
        let unfinished = match deadline {
            Some(deadline) => format!(
                "did not finish within the {}s deadline (a read or tool that never returns); \
                 its findings are missing",
                deadline.as_secs_f64()
            ),
            None => "backend thread failed".to_string(),
        };
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
                        findings: Findings::warning(unfinished.clone()),
                        elapsed: deadline.unwrap_or_default(),
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
        // Files the backends were refused (a FIFO where a sysfs attribute should be) are a
        // warning on the report, whichever backend asked.
        let refused = context.host().take_refused();
        let mut runs = runs;
        if !refused.is_empty() {
            runs.push(BackendRun {
                backend: "host",
                findings: Findings {
                    warnings: refused,
                    ..Findings::default()
                },
                elapsed: std::time::Duration::ZERO,
            });
        }
        (merge(runs, with_timings), timings)
    }
}

/// Runs the queue of one run to its end: this thread takes backends, and helpers take over
/// while it waits on a tool; joined until none is left.
fn drive(context: &Context, crew: &Crew) {
    crew.work(context);
    // Helpers may start further helpers until the queue is empty; join until none is left.
    while let Some(helper) = lock(&crew.helpers).pop() {
        let _ = helper.join();
    }
    *lock(&context.crew) = None;
}

/// Most helper threads one detection run starts, besides the caller's.
pub const MAX_HELPERS: usize = 8;

/// The shared state of one detection run: the backend queue and what has finished.
struct Crew {
    backends: Arc<[Box<dyn Backend>]>,
    /// Weak, because the context holds the crew during the run.
    context: Weak<Context>,
    next: AtomicUsize,
    helpers_started: AtomicUsize,
    helpers: Mutex<Vec<JoinHandle<()>>>,
    finished: Mutex<Vec<(usize, BackendRun)>>,
}

impl std::fmt::Debug for Crew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Crew")
            .field("next", &self.next)
            .field("helpers_started", &self.helpers_started)
            .finish_non_exhaustive()
    }
}

impl Crew {
    /// Runs queued backends until the queue is empty.
    fn work(&self, context: &Context) {
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(backend) = self.backends.get(index) else {
                return;
            };
            let run = run_one(backend.as_ref(), context);
            lock(&self.finished).push((index, run));
        }
    }

    /// Starts a helper for the rest of the queue, if anything is left and the cap allows.
    fn add_helper(self: &Arc<Self>) {
        if self.next.load(Ordering::Relaxed) >= self.backends.len() {
            return;
        }
        let started = self.helpers_started.fetch_add(1, Ordering::Relaxed);
        if started >= MAX_HELPERS {
            return;
        }
        let crew = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name("hwaccel-detect".into())
            .spawn(move || {
                if let Some(context) = crew.context.upgrade() {
                    crew.work(&context);
                }
            });
        // Without a helper the waiting thread simply takes the rest of the queue afterwards.
        if let Ok(handle) = spawned {
            lock(&self.helpers).push(handle);
        }
    }
}

/// Locks a mutex, carrying on past a panic in another holder: the data here (a queue of
/// results, a list of handles) stays valid whatever the panicking thread was doing.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

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

    /// Waits on a tool that sleeps, as a backend waits on a slow vendor tool.
    struct Sleeps(&'static str);
    impl Backend for Sleeps {
        fn name(&self) -> &'static str {
            self.0
        }
        fn detect(&self, ctx: &Context) -> Findings {
            match ctx.run_tool("slow-tool", &[]) {
                Ok(Some(_)) => Findings::warning(self.0),
                other => Findings::warning(format!("{other:?}")),
            }
        }
    }

    fn sleepy_tools() -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slow-tool");
        std::fs::write(&path, "#!/bin/sh\nsleep 0.3\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn backends_waiting_on_tools_overlap_and_priority_order_is_kept() {
        let tools = sleepy_tools();
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
            CommandRunner::new(vec![tools.path().to_path_buf()]),
            backends,
        );
        let started = Instant::now();
        let (report, timings) = detector.run(false);
        // One after another, the three tools would take 900 ms.
        assert!(started.elapsed() < std::time::Duration::from_millis(800));
        let order: Vec<_> = timings.iter().map(|t| t.backend.as_str()).collect();
        assert_eq!(order, report.backends);
        assert_eq!(order[..3], ["slow-a", "fast-a", "slow-b"]);
        assert_eq!(order.last(), Some(&"slow-c"));
        // The first backend in priority order keeps the duplicated device.
        assert_eq!(report.devices[0].backend, "fast-a");
        let messages: Vec<_> = report.warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(messages, ["slow-a", "slow-b", "slow-c"]);
    }

    /// Records the thread it ran on.
    struct WhereAmI(&'static str, Arc<Mutex<Vec<thread::ThreadId>>>);
    impl Backend for WhereAmI {
        fn name(&self) -> &'static str {
            self.0
        }
        fn detect(&self, _: &Context) -> Findings {
            lock(&self.1).push(thread::current().id());
            Findings::default()
        }
    }

    #[test]
    fn backends_without_tools_run_on_the_calling_thread() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let backends: Vec<Box<dyn Backend>> = ["a", "b", "c"]
            .into_iter()
            .map(|name| Box::new(WhereAmI(name, Arc::clone(&seen))) as _)
            .collect();
        let detector = Detector::with_backends(
            HostRoot::new("/nonexistent"),
            CommandRunner::new(Vec::new()),
            backends,
        );
        let (report, _) = detector.run(false);
        assert_eq!(report.backends, ["a", "b", "c"]);
        assert_eq!(*lock(&seen), vec![thread::current().id(); 3]);
    }

    struct CountsPci;
    impl Backend for CountsPci {
        fn name(&self) -> &'static str {
            "counts-pci"
        }
        fn detect(&self, ctx: &Context) -> Findings {
            let devices = ctx
                .pci()
                .iter()
                .map(|f| Device::new(&f.address, Vendor::Other, Family::Asic, "x", "counts-pci"))
                .collect();
            Findings {
                devices,
                ..Findings::default()
            }
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

    /// A backend whose read never returns (a hung NFS or FUSE file).
    struct Hangs;
    impl Backend for Hangs {
        fn name(&self) -> &'static str {
            "hangs"
        }
        fn detect(&self, _: &Context) -> Findings {
            loop {
                thread::park();
            }
        }
    }

    #[test]
    fn a_run_past_its_deadline_reports_what_finished_and_names_what_did_not() {
        let detector = Detector::with_backends(
            HostRoot::new("/nonexistent"),
            CommandRunner::new(Vec::new()),
            vec![
                Box::new(Fixed("a", vec!["0000:01:00.0"])),
                Box::new(Hangs),
                Box::new(Fixed("c", vec!["0000:02:00.0"])),
            ],
        );
        let started = Instant::now();
        let (report, timings, in_time) =
            detector.run_within(false, std::time::Duration::from_millis(200));
        assert!(!in_time);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // "a" finished; "c" was queued behind the hung read on the same thread.
        let ids: Vec<&str> = report.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:01:00.0"]);
        assert_eq!(report.backends, ["a", "hangs", "c"]);
        let mut unfinished: Vec<&str> =
            report.warnings.iter().map(|w| w.backend.as_str()).collect();
        unfinished.sort_unstable();
        assert_eq!(unfinished, ["c", "hangs"]);
        assert!(
            report.warnings[0].message.contains("deadline"),
            "{}",
            report.warnings[0].message
        );
        assert_eq!(timings.len(), 3);
    }

    #[test]
    fn a_run_within_its_deadline_is_the_plain_run() {
        let detector = Detector::with_backends(
            HostRoot::new("/nonexistent"),
            CommandRunner::new(Vec::new()),
            vec![Box::new(Fixed("a", vec!["0000:01:00.0"]))],
        );
        let (within, _, in_time) = detector.run_within(false, std::time::Duration::from_secs(60));
        assert!(in_time);
        assert_eq!(within, detector.run(false).0);
    }
}
