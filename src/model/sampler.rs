//! `sampler`.
