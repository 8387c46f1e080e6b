//! The pinned nvcc: where it is, how to install it, how it is called.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// The pip packages of the pinned toolchain (nvcc 13.0: PTX ISA 9.0, which driver 580 JITs).
/// `nvidia-cuda-cccl` holds `<nv/target>`, which `cuda_bf16.h` (and so `mma.h`, the warp
/// matrix functions) includes.
pub const PIP_PINS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
];

/// nvcc's flags for every kernel file (recorded in the manifest): PTX only for `compute_80`
/// (the driver JITs it for the GPU it finds, Ampere or newer), no fused multiply-add
/// contraction (`acc + a·b` is two roundings, as on the host; an FMA is written `__fmaf_rn`),
/// no `-lineinfo` (the PTX holds no checkout path).
pub const NVCC_FLAGS: [&str; 5] = [
    "-ptx",
    "-arch=compute_80",
    "--fmad=false",
    "-O3",
    "-std=c++17",
];

/// The nvcc release the pins give, as `nvcc --version` prints it.
pub const RELEASE: &str = "release 13.0";

/// Where the pinned wheels put nvcc under a pip `--target` directory.
pub fn bin_in(site_packages: &Path) -> PathBuf {
    site_packages.join("nvidia/cu13/bin/nvcc")
}

/// A pinned nvcc (release 13.0), checked by running `nvcc --version`.
#[derive(Debug, Clone)]
pub struct Nvcc {
    path: PathBuf,
    release: String,
}

impl Nvcc {
    /// The nvcc at `path`; an error when it does not run or is not release 13.0 (another
    /// release writes another PTX, and 13.1+ a PTX ISA driver 580 refuses).
    pub fn at(path: impl Into<PathBuf>) -> Result<Nvcc, Error> {
        let path = path.into();
        let out = Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| Error::new(format!("cannot run {}: {e}", path.display())))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let release = text
            .lines()
            .find(|l| l.contains("release"))
            .unwrap_or("unknown")
            .trim()
            .to_owned();
        if !release.contains(RELEASE) {
            return Err(Error::new(format!(
                "{} is {release:?}; the pipeline is pinned to nvcc {RELEASE} \
                 (pip install {})",
                path.display(),
                PIP_PINS.join(" ")
            )));
        }
        Ok(Nvcc { path, release })
    }

    /// The nvcc named by the environment variable `TL_NVCC`, if it is set (`None` when it is
    /// not: no nvcc, the committed PTX is used as it is).
    pub fn from_env() -> Option<Result<Nvcc, Error>> {
        let p = std::env::var_os("TL_NVCC")?;
        Some(Nvcc::at(PathBuf::from(p)))
    }

    /// The nvcc of the pinned wheels under `site_packages`, installing them there first with
    /// `python3 -m pip install --upgrade --target` when it, or a pinned header it needs
    /// (`nv/target`, from an install that predates that pin), is missing.
    pub fn install_pinned(site_packages: &Path) -> Result<Nvcc, Error> {
        let bin = bin_in(site_packages);
        let cccl = site_packages.join("nvidia/cu13/include/nv/target");
        if !bin.is_file() || !cccl.is_file() {
            eprintln!(
                "installing the pinned nvcc into {}",
                site_packages.display()
            );
            let status = Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "--upgrade", "--target"])
                .arg(site_packages)
                .args(PIP_PINS)
                .status()
                .map_err(|e| Error::new(format!("cannot run python3 -m pip: {e}")))?;
            if !status.success() || !bin.is_file() || !cccl.is_file() {
                return Err(Error::new(format!(
                    "pip install {PIP_PINS:?} ({status}) left no {}",
                    bin.display()
                )));
            }
        }
        Nvcc::at(bin)
    }

    /// Where this nvcc is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its release line (`Cuda compilation tools, release 13.0, V13.0.88`).
    pub fn release(&self) -> &str {
        &self.release
    }

    /// `nvcc NVCC_FLAGS src -o out`.
    pub fn ptx(&self, src: &Path, out: &Path) -> Result<(), Error> {
        let status = Command::new(&self.path)
            .args(NVCC_FLAGS)
            .arg(src)
            .arg("-o")
            .arg(out)
            .status()
            .map_err(|e| Error::new(format!("cannot run {}: {e}", self.path.display())))?;
        if status.success() {
            Ok(())
        } else {
            Err(Error::new(format!(
                "nvcc {} failed ({status})",
                src.display()
            )))
        }
    }
}
