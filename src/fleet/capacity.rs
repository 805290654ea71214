//! Capacity in units of models: how many more replicas of a model fit on the free devices,
//! which free devices are stranded, and which nodes to add when a model does not fit.
