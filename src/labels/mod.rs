//! Turns a detection report into node labels under `hwaccel.io/`. Pure.
