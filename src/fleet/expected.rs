//! How many accelerators a node should have: an explicit count, its cloud instance type's
//! count, or the most it has been seen with, and how many of them are missing now.
