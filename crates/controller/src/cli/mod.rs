//! The command line's own subcommands besides `run`: `validate` (policy files, offline) and
//! `explain` (why a node is or is not being remediated). Their logic is pure and unit-tested here;
//! `main` only parses flags, reads files or the cluster, and prints.

pub mod explain;
pub mod locate;
pub mod overlap;
pub mod validate;
