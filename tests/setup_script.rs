//! `scripts/setup.sh` (`make setup`, `make doctor`) against stand-ins, never this machine: the
//! script runs with a PATH of only a temporary folder of fakes (a `rustup` that lists the
//! pinned toolchain without the musl target, an `apt-get` and a `dpkg-query` over a recorded
//! package list, a `go`, no `<arch>-linux-musl-gcc` until the fake `apt-get` "installs"
//! musl-tools, no `/usr/bin/time` under its file-system root until it "installs" time) and links to the few utilities the script itself runs. Root and the real node
//! are the script's `HWACCEL_SETUP_AS_ROOT` / `HWACCEL_SETUP_REAL_NODE`, so neither `id` nor
//! `tc_node_supported` (which may load a kernel module) decides. The fakes record every call:
//! the tests read what was installed, in which order, and that a second run installs nothing.

// Helpers that build the stand-in machine may panic: a test that cannot set it up fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What the script and the stand-ins run besides the commands checked for: linked from this
/// machine's PATH.
const UTILITIES: &[&str] = &[
    "bash", "sed", "grep", "awk", "sort", "tr", "cat", "mkdir", "chmod", "dirname", "uname", "id",
    "head", "tail", "date",
];

/// Commands the script only looks for: present as stand-ins that do nothing.
const PRESENT: &[&str] = &[
    "cc",
    "readelf",
    "make",
    "git",
    "sha256sum",
    "python3",
    "openssl",
    "curl",
    "setsid",
    "flock",
    "ip",
];

const RUSTUP: &str = r#"#!/usr/bin/env bash
# Stand-in rustup: lists and installs in $FAKE_STATE, records every call.
echo "rustup $*" >>"$FAKE_STATE/calls"
s=$FAKE_STATE
fail() { [ "${FAKE_FAIL:-}" != "$1" ] || { echo "error: could not download ($1)" >&2; exit 1; }; }
case "$1 $2" in
  "toolchain list") cat "$s/toolchains" ;;
  "component list") cat "$s/components" ;;
  "target list") cat "$s/targets" ;;
  "toolchain install") fail toolchain; echo "$3-$FAKE_HOST" >>"$s/toolchains"; echo "$FAKE_HOST" >>"$s/targets" ;;
  "component add") fail component; shift 4; for c in "$@"; do echo "$c-$FAKE_HOST" >>"$s/components"; done ;;
  "target add") fail target; shift 4; for t in "$@"; do echo "$t" >>"$s/targets"; done ;;
  *) echo "stand-in rustup: unexpected '$*'" >&2; exit 64 ;;
esac
"#;

const APT_GET: &str = r#"#!/usr/bin/env bash
# Stand-in apt-get: `install` adds to $FAKE_STATE/debs (musl-tools also brings its compiler,
# time its /usr/bin/time under the file-system root $FAKE_FS).
echo "apt-get $*" >>"$FAKE_STATE/calls"
case $1 in
  update) [ "${FAKE_FAIL:-}" != update ] || exit 100 ;;
  install)
    [ "${FAKE_FAIL:-}" != install ] || { echo "E: Unable to locate package" >&2; exit 100; }
    shift
    for p in "$@"; do
      case $p in -*) continue ;; esac
      echo "$p" >>"$FAKE_STATE/debs"
      if [ "$p" = musl-tools ]; then
        printf '#!/usr/bin/env bash\n' >"$FAKE_BIN/$FAKE_MUSL_GCC"
        chmod +x "$FAKE_BIN/$FAKE_MUSL_GCC"
      fi
      if [ "$p" = time ]; then
        mkdir -p "$FAKE_FS/usr/bin"
        printf '#!/usr/bin/env bash\n' >"$FAKE_FS/usr/bin/time"
        chmod +x "$FAKE_FS/usr/bin/time"
      fi
    done
    ;;
  *) echo "stand-in apt-get: unexpected '$*'" >&2; exit 64 ;;
esac
"#;

const DPKG_QUERY: &str = r#"#!/usr/bin/env bash
# Stand-in dpkg-query -W -f=... PACKAGE over $FAKE_STATE/debs.
p=${!#}
if grep -qxF -- "$p" "$FAKE_STATE/debs"; then printf 'install ok installed'; exit 0; fi
echo "dpkg-query: no packages found matching $p" >&2
exit 1
"#;

const GO: &str = r#"#!/usr/bin/env bash
# Stand-in go: `go env GOVERSION`.
echo "$FAKE_GO_VERSION"
"#;

/// Newer than any `go` line the cluster modules could carry.
const NEW_GO: &str = "go1.999.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn on_path(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("the set-up test needs '{name}' on PATH"))
}

fn write_executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// The pinned channel, read the way a reader of rust-toolchain.toml would.
fn channel() -> String {
    let text = fs::read_to_string(repo().join("rust-toolchain.toml")).unwrap();
    text.lines()
        .find_map(|line| line.trim().strip_prefix("channel"))
        .and_then(|rest| rest.split('"').nth(1))
        .expect("a channel in rust-toolchain.toml")
        .to_string()
}

fn arch() -> &'static str {
    std::env::consts::ARCH
}

fn musl_target() -> String {
    format!("{}-unknown-linux-musl", arch())
}

/// A machine of stand-ins: `fake/` (the commands checked and installed with), `sys/` (links to
/// the utilities the script runs), `fs/` (the root of the files checked by path), `state/`
/// (what is installed, and the calls).
struct Machine {
    dir: tempfile::TempDir,
    root: bool,
    real_node: bool,
    go_version: Option<&'static str>,
    fail: Option<&'static str>,
}

impl Machine {
    /// The issue's machine: the pinned toolchain with its components but without the musl
    /// target, no musl C compiler, none of the real node's packages; root, real node possible.
    fn issue_36() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let machine = Machine {
            dir,
            root: true,
            real_node: true,
            go_version: Some(NEW_GO),
            fail: None,
        };
        for sub in ["fake", "sys", "fs", "state"] {
            fs::create_dir(machine.path(sub)).unwrap();
        }
        for name in UTILITIES {
            symlink(on_path(name), machine.path("sys").join(name)).unwrap();
        }
        let fake = machine.path("fake");
        for name in PRESENT {
            write_executable(&fake.join(name), "#!/usr/bin/env bash\nexit 0\n");
        }
        write_executable(&fake.join("rustup"), RUSTUP);
        write_executable(&fake.join("apt-get"), APT_GET);
        write_executable(&fake.join("dpkg-query"), DPKG_QUERY);
        write_executable(&fake.join("go"), GO);
        let host = machine.host();
        machine.state_write("toolchains", &format!("{}-{host}\n", channel()));
        machine.state_write(
            "components",
            &format!(
                "cargo-{host}\nclippy-{host}\nrust-std-{host}\nrustc-{host}\nrustfmt-{host}\n"
            ),
        );
        machine.state_write("targets", &format!("{host}\n"));
        machine.state_write("debs", "");
        machine.state_write("calls", "");
        machine
    }

    /// No toolchain at all: rustup alone.
    fn without_toolchain() -> Self {
        let machine = Self::issue_36();
        for list in ["toolchains", "components", "targets"] {
            machine.state_write(list, "");
        }
        machine
    }

    fn host(&self) -> String {
        format!("{}-unknown-linux-gnu", arch())
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    fn state_write(&self, name: &str, text: &str) {
        fs::write(self.path("state").join(name), text).unwrap();
    }

    fn musl_gcc(&self) -> PathBuf {
        self.path("fake").join(format!("{}-linux-musl-gcc", arch()))
    }

    fn run(&self, args: &[&str]) -> Output {
        let path = std::env::join_paths([self.path("fake"), self.path("sys")]).unwrap();
        let flag = |on: bool| if on { "1" } else { "0" };
        let mut command = Command::new(self.path("sys").join("bash"));
        command
            .arg(repo().join("scripts/setup.sh"))
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("HWACCEL_SETUP_AS_ROOT", flag(self.root))
            .env("HWACCEL_SETUP_REAL_NODE", flag(self.real_node))
            .env("HWACCEL_SETUP_GO_DIRS", "")
            .env("HWACCEL_SETUP_LOG", self.path("setup.log"))
            .env("HWACCEL_SETUP_FS_ROOT", self.path("fs"))
            .env("FAKE_FS", self.path("fs"))
            .env("FAKE_STATE", self.path("state"))
            .env("FAKE_BIN", self.path("fake"))
            .env("FAKE_HOST", self.host())
            .env("FAKE_MUSL_GCC", format!("{}-linux-musl-gcc", arch()))
            .env("FAKE_FAIL", self.fail.unwrap_or(""));
        match self.go_version {
            Some(version) => {
                command.env("FAKE_GO_VERSION", version);
            }
            None => {
                let _ = fs::remove_file(self.path("fake").join("go"));
            }
        }
        command.output().unwrap()
    }

    /// Every call to the stand-ins since the last `take_calls`, then forgets them.
    fn take_calls(&self) -> Vec<String> {
        let file = self.path("state").join("calls");
        let text = fs::read_to_string(&file).unwrap();
        fs::write(&file, "").unwrap();
        text.lines().map(str::to_string).collect()
    }

    /// The calls that change something (not the `list` queries), in order.
    fn take_installs(&self) -> Vec<String> {
        self.take_calls()
            .into_iter()
            .filter(|call| !call.contains(" list"))
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one line a failed run prints, or a panic saying what it printed instead.
fn one_line(output: &Output) -> String {
    assert!(!output.status.success(), "{}", text(&output.stdout));
    let stderr = text(&output.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line on stderr, got:\n{stderr}");
    lines[0].to_string()
}

fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "setup failed:\n{}{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

fn position(calls: &[String], prefix: &str) -> usize {
    calls
        .iter()
        .position(|call| call.starts_with(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' in {calls:#?}"))
}

#[test]
fn the_issue_36_machine_gets_the_musl_target_and_musl_tools_once() {
    let machine = Machine::issue_36();
    let stdout = succeeded(&machine.run(&[]));
    let installs = machine.take_installs();
    assert_eq!(installs.len(), 3, "{installs:#?}");
    assert_eq!(
        installs[0],
        format!(
            "rustup target add --toolchain {} {}",
            channel(),
            musl_target()
        )
    );
    assert_eq!(installs[1], "apt-get update -q");
    let packages: Vec<&str> = installs[2]
        .strip_prefix("apt-get install ")
        .unwrap_or_else(|| panic!("{installs:#?}"))
        .split_whitespace()
        .filter(|word| !word.starts_with('-'))
        .collect();
    for package in [
        "musl-tools",
        "time",
        "runc",
        "containernetworking-plugins",
        "busybox-static",
    ] {
        assert!(packages.contains(&package), "{package} in {packages:?}");
    }
    assert!(machine.musl_gcc().exists(), "the stand-in musl-tools ran");
    assert!(
        machine.path("fs/usr/bin/time").exists(),
        "the stand-in time ran"
    );
    assert!(
        stdout.contains(&format!("installed: rust targets {}", musl_target()))
            && stdout.contains("musl-tools"),
        "it says what it installed:\n{stdout}"
    );

    let again = succeeded(&machine.run(&[]));
    assert_eq!(machine.take_installs(), Vec::<String>::new(), "{again}");
    assert!(again.contains("nothing installed"), "{again}");
}

#[test]
fn a_toolchain_comes_before_its_components_and_targets_and_rust_before_apt() {
    let machine = Machine::without_toolchain();
    succeeded(&machine.run(&[]));
    let installs = machine.take_installs();
    let order = [
        format!("rustup toolchain install {}", channel()),
        format!(
            "rustup component add --toolchain {} clippy rustfmt",
            channel()
        ),
        format!(
            "rustup target add --toolchain {} {}",
            channel(),
            musl_target()
        ),
        "apt-get update".to_string(),
        "apt-get install".to_string(),
    ];
    let at: Vec<usize> = order
        .iter()
        .map(|prefix| position(&installs, prefix))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{installs:#?}");
    assert_eq!(installs.len(), order.len(), "each once: {installs:#?}");
}

#[test]
fn a_failed_install_stops_with_one_line_naming_its_command() {
    let mut machine = Machine::issue_36();
    machine.fail = Some("install");
    let line = one_line(&machine.run(&[]));
    assert!(
        line.contains("'apt-get install") && line.contains("musl-tools") && line.contains("failed"),
        "{line}"
    );
    let installs = machine.take_installs();
    assert!(
        installs
            .last()
            .is_some_and(|c| c.starts_with("apt-get install")),
        "{installs:#?}"
    );

    let mut machine = Machine::issue_36();
    machine.fail = Some("target");
    let line = one_line(&machine.run(&[]));
    assert!(
        line.contains(&format!("'rustup target add --toolchain {}", channel())),
        "{line}"
    );
    let installs = machine.take_installs();
    assert!(
        installs.iter().all(|call| !call.starts_with("apt-get")),
        "it stopped at the failure: {installs:#?}"
    );
}

#[test]
fn what_it_cannot_install_is_one_line_naming_the_command() {
    // Go: never installed by the script, absent or too old.
    for go_version in [None, Some("go1.0.1")] {
        let mut machine = Machine::issue_36();
        succeeded(&machine.run(&[]));
        machine.take_calls();
        machine.go_version = go_version;
        let line = one_line(&machine.run(&[]));
        assert!(
            line.contains("go >= ") && line.contains("https://go.dev/dl/go"),
            "{line}"
        );
        assert!(
            go_version.is_none_or(|version| line.contains(version)),
            "names what it found: {line}"
        );
        assert_eq!(machine.take_installs(), Vec::<String>::new());
    }

    // Not root: apt-get is not run; the one line is the command to run with sudo.
    let mut machine = Machine::issue_36();
    machine.root = false;
    let line = one_line(&machine.run(&[]));
    assert!(
        line.contains("sudo apt-get install -y") && line.contains("musl-tools"),
        "{line}"
    );
    let installs = machine.take_installs();
    assert!(
        installs.iter().all(|call| !call.starts_with("apt-get")),
        "{installs:#?}"
    );
}

#[test]
fn without_a_real_node_its_packages_are_left_alone() {
    let mut machine = Machine::issue_36();
    machine.real_node = false;
    succeeded(&machine.run(&[]));
    let installs = machine.take_installs();
    let install = &installs[position(&installs, "apt-get install")];
    assert!(
        install.contains("musl-tools") && !install.contains("runc"),
        "`make test` builds the image everywhere, the node's packages only matter to the node: {install}"
    );

    // The demo without a real node runs no image: nothing of the image's either.
    let mut machine = Machine::issue_36();
    machine.real_node = false;
    succeeded(&machine.run(&["--demo"]));
    assert_eq!(machine.take_installs(), Vec::<String>::new());
}

#[test]
fn doctor_reads_and_never_installs() {
    let machine = Machine::issue_36();
    let output = machine.run(&["--check"]);
    assert!(!output.status.success(), "something is missing");
    let table = text(&output.stdout);
    assert_eq!(machine.take_installs(), Vec::<String>::new(), "{table}");
    let row = |what: &str| {
        table
            .lines()
            .find(|line| line.starts_with(what))
            .unwrap_or_else(|| panic!("no row '{what}':\n{table}"))
            .to_string()
    };
    let target = row(&format!("rust target {}", musl_target()));
    assert!(
        target.contains(" missing ") && target.contains("rustup target add"),
        "{target}"
    );
    assert!(row("rust component clippy").contains(" found "), "{table}");
    let gcc = row(&format!("{}-linux-musl-gcc", arch()));
    assert!(
        gcc.contains(" missing ") && gcc.contains("apt-get install musl-tools"),
        "{gcc}"
    );
    assert!(row("runc").contains(" missing "), "{table}");

    succeeded(&machine.run(&[]));
    machine.take_calls();
    let after = succeeded(&machine.run(&["--check"]));
    assert!(after.contains("all prerequisites found"), "{after}");
    assert!(!after.contains(" missing "), "{after}");
    assert_eq!(machine.take_installs(), Vec::<String>::new());
}
