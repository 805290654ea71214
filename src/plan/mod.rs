//! The placement planner: model memory, precision choice, parallelism search and fleet
//! placement. Pure: no I/O, no Kubernetes.
