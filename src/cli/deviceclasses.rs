//! `hwaccel deviceclasses`: print the cross-vendor DRA DeviceClasses, or the chart file that
//! installs them.

use std::process::ExitCode;

use super::write_stdout;

#[derive(Debug, clap::Args)]
pub(super) struct DeviceClassesArgs {
    /// Print the chart template (the classes behind `.Values.dra.deviceClasses.enabled`)
    /// instead of plain YAML.
    #[arg(long)]
    chart: bool,
    /// Give each class its extended resource name (`hwaccel.io/gpu` for `gpu.hwaccel.io`), so
    /// pods can ask for `resources.limits: {hwaccel.io/gpu: 1}` (Kubernetes 1.37+). Not with
    /// --chart, where the value `dra.deviceClasses.extendedResourceNames` decides.
    #[arg(long, conflicts_with = "chart")]
    extended_resource_names: bool,
}

/// Runs `hwaccel deviceclasses`.
pub(super) fn run(args: DeviceClassesArgs) -> anyhow::Result<ExitCode> {
    let text = if args.chart {
        crate::dra::device_classes::chart_template()?
    } else {
        crate::dra::device_classes::all_yaml(args.extended_resource_names)?
    };
    write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
