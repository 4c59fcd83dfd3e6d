//! The `kv_cache` op family: argument checks, dispatch building, and its `Session` methods.
