//! The `copy` op family: argument checks, dispatch building, and its `Session` methods.
