//! `synth`.
