//! `chat`.
