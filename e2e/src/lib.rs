//! End-to-end tests against a real local control plane live in `tests/`.
#![forbid(unsafe_code)]
