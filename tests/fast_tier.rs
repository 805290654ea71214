//! The fast tier's integration tests in one test binary: the CLI on fixture hosts, the chart
//! rendered by helm, the planner's calibration and properties, the Dockerfile, the
//! observability files and the set-up script (against stand-ins). One module per area;
//! `cargo test` runs them with the unit tests.
//!
//! One binary links the library once instead of once per area. `detect_detached_tools`
//! stays its own binary: it counts its process's threads, which other tests would disturb.

mod helm;

mod agent_process;
mod architecture;
mod chart;
mod detect_captures;
mod detect_cli;
mod detect_layout;
mod dockerfile;
mod examples;
mod fleet_cli;
mod fleet_views_agree;
mod lint_slices_cli;
mod nvml_glibc;
mod observability;
mod plan_calibration;
mod plan_cli;
mod plan_deployments;
mod plan_properties;
mod plan_training_published;
mod plan_training_trace;
mod setup_script;
