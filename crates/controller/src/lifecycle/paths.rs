//! Random paths through the lifecycle.
