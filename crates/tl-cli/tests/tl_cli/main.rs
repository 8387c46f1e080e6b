//! The integration tests of the `tl` command, one module per topic, in one test binary (linking
//! one binary per file dominated `cargo test`; docs/verification.md). One module, for example:
//! `cargo test -p tl-cli --test tl_cli errors::`.

#[path = "../common/mod.rs"]
mod common;

mod errors;
mod fno_paper;
mod fuzz;
mod learning;
mod models;
