//! The fleet's health roll-up: per node and per product, devices present, healthy, missing.
