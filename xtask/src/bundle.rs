//! `cargo xtask gpu-bundle`: placeholder, filled in below.
pub fn build() -> Result<(), String> {
    Err("not written yet".to_owned())
}
