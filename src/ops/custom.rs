//! User kernels: dispatch your own kernel, declaring each argument's access.
