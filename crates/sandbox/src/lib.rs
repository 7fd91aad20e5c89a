//! A real local control plane and a simulated GPU fleet. (Being built: see the open issues.)
#![forbid(unsafe_code)]
