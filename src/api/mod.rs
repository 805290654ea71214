//! Custom resource types of the `hwaccel.io/v1alpha1` API.
