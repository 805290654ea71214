//! Running a vendor tool and parsing what it prints, the way every backend does it: a tool
//! that is not installed is silent, one that fails (does not start, exits non-zero, times out,
//! floods its output) is a warning in the runner's words, and output the parser refuses is a
//! warning naming the command line and the parser's reason.
//!
//! Tools run through [`Context::run_tool`], so a backend waiting on one hands the rest of the
//! detection queue to a helper thread. NVIDIA's `nvidia-smi` calls do not come through here:
//! the CSV query retries without fields the driver refuses, and the supplementary queries treat
//! a non-zero exit as "not supported" rather than as trouble.

use crate::detect::{CommandError, Context};

/// How a warning words output that the parser refused. Each backend keeps the wording its
/// warnings have always had, since reports (and whoever reads them) carry it; a new backend
/// takes `UnusableOutput`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wording {
    /// `xpu-smi topology -m: unusable output: <reason>`.
    UnusableOutput,
    /// `vulkaninfo --summary printed unparsable output: <reason>`.
    PrintedUnparsable,
}

/// Why a tool that is installed gave nothing usable.
#[derive(Debug)]
pub(crate) enum ToolFailure {
    /// It did not run to a clean exit.
    Run(CommandError),
    /// It ran, but the parser refused its output, for this reason.
    Output(String),
}

/// A vendor tool as a backend runs it: its name, and how its warnings word refused output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tool {
    /// The program, looked up on the runner's search path (`xpu-smi`).
    pub(crate) name: &'static str,
    /// How a warning words output the parser refused.
    pub(crate) wording: Wording,
}

impl Tool {
    /// A tool named `name` whose refused output is worded as `wording`.
    pub(crate) const fn new(name: &'static str, wording: Wording) -> Self {
        Self { name, wording }
    }

    /// Runs the tool with `args` and parses its stdout. `Ok(None)` when it is not installed.
    pub(crate) fn try_parsed<T>(
        self,
        ctx: &Context,
        args: &[&str],
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ToolFailure> {
        match ctx.run_tool(self.name, args) {
            Ok(None) => Ok(None),
            Ok(Some(output)) => parse(&output.stdout).map(Some).map_err(ToolFailure::Output),
            Err(err) => Err(ToolFailure::Run(err)),
        }
    }

    /// Runs the tool with `args` and parses its stdout; `None` when it is not installed
    /// (silently) or gave nothing usable (with a warning pushed onto `warnings`).
    pub(crate) fn run_parsed<T>(
        self,
        ctx: &Context,
        args: &[&str],
        parse: impl FnOnce(&str) -> Result<T, String>,
        warnings: &mut Vec<String>,
    ) -> Option<T> {
        self.try_parsed(ctx, args, parse).unwrap_or_else(|failure| {
            warnings.push(self.warning(&failure, args));
            None
        })
    }

    /// The warning for a failure of the tool run with `args`.
    pub(crate) fn warning(self, failure: &ToolFailure, args: &[&str]) -> String {
        match failure {
            ToolFailure::Run(err) => err.to_string(),
            ToolFailure::Output(reason) => {
                let command = std::iter::once(self.name)
                    .chain(args.iter().copied())
                    .collect::<Vec<_>>()
                    .join(" ");
                match self.wording {
                    Wording::UnusableOutput => format!("{command}: unusable output: {reason}"),
                    Wording::PrintedUnparsable => {
                        format!("{command} printed unparsable output: {reason}")
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::testing::{context_at, tool_dir};

    fn parse_number(text: &str) -> Result<u32, String> {
        text.trim()
            .parse()
            .map_err(|_| format!("{:?} is no number", text.trim()))
    }

    fn run(script: &str, wording: Wording) -> (Option<u32>, Vec<String>) {
        let host = tempfile::tempdir().unwrap();
        let tools = tool_dir("counter", script);
        let ctx = context_at(host.path(), Some(tools.path()));
        let mut warnings = Vec::new();
        let counter = Tool::new("counter", wording);
        let parsed = counter.run_parsed(&ctx, &["--count", "all"], parse_number, &mut warnings);
        (parsed, warnings)
    }

    #[test]
    fn parsed_output_and_no_warning() {
        let (parsed, warnings) = run("#!/bin/sh\necho 42\n", Wording::UnusableOutput);
        assert_eq!(parsed, Some(42));
        assert!(warnings.is_empty());
    }

    #[test]
    fn a_missing_tool_is_silent() {
        let host = tempfile::tempdir().unwrap();
        let ctx = context_at(host.path(), None);
        let mut warnings = Vec::new();
        let counter = Tool::new("counter", Wording::UnusableOutput);
        let parsed = counter.run_parsed(&ctx, &[], parse_number, &mut warnings);
        assert_eq!(parsed, None);
        assert!(warnings.is_empty());
    }

    #[test]
    fn refused_output_is_worded_either_way() {
        let garbage = "#!/bin/sh\necho many\n";
        let (parsed, warnings) = run(garbage, Wording::UnusableOutput);
        assert_eq!(parsed, None);
        assert_eq!(
            warnings,
            ["counter --count all: unusable output: \"many\" is no number"]
        );
        let (_, warnings) = run(garbage, Wording::PrintedUnparsable);
        assert_eq!(
            warnings,
            ["counter --count all printed unparsable output: \"many\" is no number"]
        );
    }

    #[test]
    fn a_failing_tool_is_a_warning_in_the_runners_words() {
        let (parsed, warnings) = run(
            "#!/bin/sh\necho 7\necho 'no device' >&2\nexit 2\n",
            Wording::UnusableOutput,
        );
        assert_eq!(parsed, None);
        assert_eq!(warnings, ["counter failed (exit code 2): no device"]);
    }
}
